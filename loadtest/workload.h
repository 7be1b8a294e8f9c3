// What kimi-loadtest sends: prompt and output lengths drawn from a distribution or read from a
// JSONL file, and Poisson arrival times.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kimi::loadtest {

// The longest prompt or output a request can name (the wire's uint32; the server's own limits are
// far lower and refuse with INVALID_ARGUMENT).
inline constexpr int64_t kMaxLength = 4294967295;

// "fixed:N", "uniform:A:B" (inclusive).
struct LengthDist {
  int64_t lo = 0, hi = 0;
  int64_t Draw(std::mt19937_64& rng) const;
};
absl::StatusOr<LengthDist> ParseLengthDist(const std::string& spec, const char* flag);

struct RequestShape {
  std::string prompt_text;       // a JSONL "prompt", or empty for random token ids
  int64_t prompt_tokens = 0;     // when prompt_text is empty
  int64_t max_tokens = 0;
};

// JSONL lines: {"prompt": "...", "max_tokens": N} or {"prompt_tokens": N, "output_tokens": M}.
absl::StatusOr<std::vector<RequestShape>> ReadJsonl(const std::string& path);

// Arrival offsets (seconds from the start) of a Poisson process at `rate` per second, up to
// `duration` seconds or `max_requests` arrivals, whichever comes first.
std::vector<double> PoissonArrivals(double rate, double duration, int64_t max_requests,
                                    std::mt19937_64& rng);

}  // namespace kimi::loadtest
