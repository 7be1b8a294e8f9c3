#include "kernels/cpu/norm.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/thread_pool.h"

namespace kimi::cpu {
namespace {

double SumSquares(const float* x, int64_t dim) {
  double s = 0.0;
  for (int64_t j = 0; j < dim; ++j) s += static_cast<double>(x[j]) * x[j];
  return s;
}

}  // namespace

void RmsNorm(float* out, const float* x, const float* weight, int64_t rows, int64_t dim,
             float eps) {
  ParallelFor(rows, std::max<int64_t>(1, 4096 / std::max<int64_t>(dim, 1)),
              [&](int64_t begin, int64_t end) {
                for (int64_t i = begin; i < end; ++i) {
                  const float* xi = x + i * dim;
                  float* oi = out + i * dim;
                  const float rstd = static_cast<float>(
                      1.0 / std::sqrt(SumSquares(xi, dim) / static_cast<double>(dim) + eps));
                  for (int64_t j = 0; j < dim; ++j) {
                    oi[j] = weight ? xi[j] * rstd * weight[j] : xi[j] * rstd;
                  }
                }
              });
}

void L2Norm(float* x, int64_t rows, int64_t dim, float eps) {
  ParallelFor(rows, std::max<int64_t>(1, 4096 / std::max<int64_t>(dim, 1)),
              [&](int64_t begin, int64_t end) {
                for (int64_t i = begin; i < end; ++i) {
                  float* xi = x + i * dim;
                  const float inv = static_cast<float>(1.0 / std::sqrt(SumSquares(xi, dim) + eps));
                  for (int64_t j = 0; j < dim; ++j) xi[j] *= inv;
                }
              });
}

}  // namespace kimi::cpu
