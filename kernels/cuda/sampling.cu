#include "kernels/cuda/sampling.h"

#include "absl/strings/str_cat.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/device_util.cuh"

namespace kimi::cuda {
namespace {

constexpr int kThreads = 1024;  // == kSampleMaxCandidates (one candidate per thread in the sort)

__host__ __device__ inline uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__host__ __device__ inline double UniformAt(uint64_t seed, uint64_t index) {
  const uint64_t h = Mix(Mix(seed ^ 0x9e3779b97f4a7c15ull) + index * 0xd1b54a32d192ed03ull);
  return static_cast<double>(h >> 11) * (1.0 / 9007199254740992.0);
}

// A total order on (logit, id): larger logit first, then lower id. Never 0 for a real entry.
__device__ __forceinline__ uint64_t Key(float v, int64_t id) {
  uint32_t b = __float_as_uint(v);
  b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return (static_cast<uint64_t>(b) << 32) | (0xffffffffull - static_cast<uint64_t>(id));
}
__device__ __forceinline__ int64_t KeyId(uint64_t key) {
  return static_cast<int64_t>(0xffffffffull - (key & 0xffffffffull));
}

struct Shared {
  unsigned hist[256];
  uint64_t cand[kThreads];
  double part[kThreads];
  uint64_t prefix;
  unsigned rank;
  unsigned count;
  int found;
};

// The key of rank `rank` (1 = best) among the row's entries: 8 passes of an 8-bit histogram.
__device__ uint64_t SelectKey(Shared& sh, const float* l, int64_t V, unsigned rank) {
  if (threadIdx.x == 0) {
    sh.prefix = 0;
    sh.rank = rank;
  }
  for (int shift = 56; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += kThreads) sh.hist[i] = 0;
    __syncthreads();
    const uint64_t prefix = sh.prefix;
    const uint64_t high_mask = shift == 56 ? 0 : ~0ull << (shift + 8);
    for (int64_t i = threadIdx.x; i < V; i += kThreads) {
      const uint64_t k = Key(l[i], i);
      if ((k & high_mask) == (prefix & high_mask)) atomicAdd(&sh.hist[(k >> shift) & 0xff], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      unsigned r = sh.rank;
      int bin = 255;
      for (; bin > 0; --bin) {
        if (sh.hist[bin] >= r) break;
        r -= sh.hist[bin];
      }
      sh.prefix = prefix | (static_cast<uint64_t>(bin) << shift);
      sh.rank = r;
    }
    __syncthreads();
  }
  return sh.prefix;
}

__global__ void __launch_bounds__(kThreads)
    SampleKernel(int32_t* tokens, float* logprobs, int32_t* needs_host, const float* logits,
                 const SampleParams* params, int64_t V) {
  __shared__ Shared sh;
  const int64_t row = blockIdx.x;
  const float* l = logits + row * V;
  const SampleParams p = params[row];
  const int tid = threadIdx.x;

  // Best entry (first max) and the log-sum-exp of the raw row.
  uint64_t best = 0;
  for (int64_t i = tid; i < V; i += kThreads) {
    const uint64_t k = Key(l[i], i);
    if (k > best) best = k;
  }
  sh.cand[tid] = best;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (tid < w && sh.cand[tid + w] > sh.cand[tid]) sh.cand[tid] = sh.cand[tid + w];
    __syncthreads();
  }
  const int64_t argmax = KeyId(sh.cand[0]);
  const float top = l[argmax];
  __syncthreads();
  double s = 0.0;
  for (int64_t i = tid; i < V; i += kThreads) s += exp(static_cast<double>(l[i] - top));
  sh.part[tid] = s;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (tid < w) sh.part[tid] += sh.part[tid + w];
    __syncthreads();
  }
  const double lse = top + log(sh.part[0]);
  __syncthreads();

  int64_t chosen = argmax;
  int host = 0;
  if (p.temperature > 0.0f) {
    const double u = UniformAt(p.seed, p.index);
    const double inv_t = 1.0 / p.temperature;
    const bool filtered = (p.top_k > 0 && p.top_k < V) || p.top_p < 1.0f || p.min_p > 0.0f;
    if (!filtered) {
      // Walk ids in order: per-thread contiguous segments, their sums scanned in order.
      const int64_t seg = (V + kThreads - 1) / kThreads;
      const int64_t b0 = tid * seg, b1 = b0 + seg < V ? b0 + seg : V;
      double mine = 0.0;
      for (int64_t i = b0; i < b1; ++i) mine += exp((l[i] - top) * inv_t);
      sh.part[tid] = mine;
      if (tid == 0) sh.found = -1;
      __syncthreads();
      if (tid == 0) {
        double total = 0.0;
        for (int i = 0; i < kThreads; ++i) total += sh.part[i];
        const double target = u * total;
        double acc = 0.0;
        for (int i = 0; i < kThreads; ++i) {
          if (target < acc + sh.part[i]) {
            sh.found = i;
            sh.part[0] = target - acc;  // what is left to cover inside segment i
            break;
          }
          acc += sh.part[i];
        }
      }
      __syncthreads();
      chosen = V - 1;
      if (sh.found >= 0) {
        const int64_t f0 = sh.found * seg, f1 = f0 + seg < V ? f0 + seg : V;
        const double left = sh.part[0];
        double acc = 0.0;
        for (int64_t i = f0; i < f1; ++i) {
          acc += exp((l[i] - top) * inv_t);
          if (left < acc) {
            chosen = i;
            break;
          }
        }
      }
    } else {
      const int64_t keep = p.top_k > 0 && p.top_k < V ? p.top_k : V;
      const int64_t n_cand = keep < kSampleMaxCandidates ? keep : kSampleMaxCandidates;
      // Normaliser over every kept token.
      const uint64_t keep_key = keep == V ? 0 : SelectKey(sh, l, V, static_cast<unsigned>(keep));
      double part = 0.0;
      for (int64_t i = tid; i < V; i += kThreads) {
        if (Key(l[i], i) >= keep_key) part += exp((l[i] - top) * inv_t);
      }
      __syncthreads();
      sh.part[tid] = part;
      __syncthreads();
      double total = 0.0;
      const bool sorted_total = keep < V && keep <= kSampleMaxCandidates;
      if (!sorted_total) {
        for (int w = kThreads / 2; w > 0; w /= 2) {
          if (tid < w) sh.part[tid] += sh.part[tid + w];
          __syncthreads();
        }
        total = sh.part[0];
      }
      // The best n_cand entries, sorted best first.
      const uint64_t cand_key = SelectKey(sh, l, V, static_cast<unsigned>(n_cand));
      sh.cand[tid] = 0;
      if (tid == 0) sh.count = 0;
      __syncthreads();
      for (int64_t i = tid; i < V; i += kThreads) {
        const uint64_t k = Key(l[i], i);
        if (k >= cand_key) {
          const unsigned slot = atomicAdd(&sh.count, 1u);
          if (slot < kThreads) sh.cand[slot] = k;
        }
      }
      __syncthreads();
      for (int k = 2; k <= kThreads; k <<= 1) {
        for (int j = k >> 1; j > 0; j >>= 1) {
          const int ixj = tid ^ j;
          if (ixj > tid) {
            const uint64_t a = sh.cand[tid], b = sh.cand[ixj];
            if ((tid & k) == 0 ? a < b : a > b) {
              sh.cand[tid] = b;
              sh.cand[ixj] = a;
            }
          }
          __syncthreads();
        }
      }
      if (tid == 0) {
        if (sorted_total) {  // the CPU sums a top-k subset in sorted order
          total = 0.0;
          for (int64_t i = 0; i < keep; ++i) total += exp((l[KeyId(sh.cand[i])] - top) * inv_t);
        }
        auto prob = [&](int64_t i) { return exp((l[KeyId(sh.cand[i])] - top) * inv_t) / total; };
        int64_t n = keep;
        if (p.top_p < 1.0f) {
          double mass = 0.0;
          int64_t m = 0;
          while (m < keep) {
            if (m >= n_cand) {
              host = 1;
              break;
            }
            mass += prob(m++);
            if (mass >= p.top_p) break;
          }
          n = m;
        }
        if (!host && p.min_p > 0.0f) {
          const double floor = p.min_p * prob(0);
          int64_t m = 1;
          while (m < n) {
            if (m >= n_cand) {
              host = 1;
              break;
            }
            if (!(prob(m) >= floor)) break;
            ++m;
          }
          n = m;
        }
        if (!host && n > n_cand) host = 1;
        if (!host) {
          double mass = 0.0;
          for (int64_t i = 0; i < n; ++i) mass += prob(i);
          const double target = u * mass;
          double acc = 0.0;
          chosen = KeyId(sh.cand[n - 1]);
          for (int64_t i = 0; i < n; ++i) {
            acc += prob(i);
            if (target < acc) {
              chosen = KeyId(sh.cand[i]);
              break;
            }
          }
        }
      }
    }
  }
  if (tid == 0) {
    tokens[row] = static_cast<int32_t>(chosen);
    if (logprobs) logprobs[row] = static_cast<float>(l[chosen] - lse);
    if (needs_host) needs_host[row] = host;
  }
}

}  // namespace

absl::Status SampleRows(int32_t* tokens, float* logprobs, int32_t* needs_host, const float* logits,
                        const SampleParams* params, int64_t rows, int64_t vocab,
                        cudaStream_t stream) {
  if (vocab <= 0 || vocab >= 0x7fffffff) {
    return absl::InvalidArgumentError(absl::StrCat("SampleRows: vocabulary of ", vocab));
  }
  if (rows <= 0) return absl::OkStatus();
  if (rows > 0x7fffffff) return absl::InvalidArgumentError("SampleRows: too many rows");
  SampleKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(tokens, logprobs, needs_host,
                                                                     logits, params, vocab);
  return LaunchStatus("SampleKernel");
}

double UniformAtHost(uint64_t seed, uint64_t index) { return UniformAt(seed, index); }

}  // namespace kimi::cuda
