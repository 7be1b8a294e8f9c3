// Drives one load level against a kimi.v1.Generation server: starts each request at its arrival
// time (open loop), keeps at most `concurrency` in flight (later arrivals wait, and that wait
// counts in their latency), and records per-token timings from the stream.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "kimi/v1/generation.grpc.pb.h"
#include "loadtest/stats.h"
#include "loadtest/workload.h"

namespace kimi::loadtest {

struct RunOptions {
  int64_t concurrency = 256;
  std::string api_key;
  float temperature = 0.0f;
  bool ignore_eos = true;
  int64_t vocab = 0;          // random prompt ids are drawn below this
  std::vector<uint32_t> shared_prefix;  // the first ids of every random prompt
  double timeout_seconds = 600;
};

// Runs `shapes[i]` at `arrivals[i]` seconds after the start; returns one result per request
// started. Once `stop` is set (Ctrl-C) no request starts and those in flight are cancelled.
std::vector<RequestResult> RunLevel(v1::Generation::Stub* stub, const std::vector<double>& arrivals,
                                    const std::vector<RequestShape>& shapes,
                                    const RunOptions& options, uint64_t seed,
                                    const std::atomic<bool>& stop);

}  // namespace kimi::loadtest
