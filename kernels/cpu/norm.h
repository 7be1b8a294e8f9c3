// Row normalisations. All sums are taken in double and the result rounded once to fp32.
#pragma once

#include <cstdint>

namespace kimi::cpu {

// out[i, :] = x[i, :] / sqrt(mean(x[i, :]^2) + eps) * weight   (weight null: no scale).
// out may alias x.
void RmsNorm(float* out, const float* x, const float* weight, int64_t rows, int64_t dim, float eps);

// x[i, :] /= sqrt(sum(x[i, :]^2) + eps), in place (fla's l2norm: eps inside the root, on the sum).
void L2Norm(float* x, int64_t rows, int64_t dim, float eps);

}  // namespace kimi::cpu
