// Per-request timings and the summary of one load level: throughput, latency percentiles,
// goodput under an SLO, errors by status.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kimi::loadtest {

struct RequestResult {
  double arrival = 0.0;       // scheduled start, seconds from the run's start
  double first_token = -1.0;  // seconds after arrival
  double end = 0.0;           // seconds after arrival
  std::vector<double> token_times;  // seconds after arrival, one per streamed token
  int64_t prompt_tokens = 0, output_tokens = 0;
  std::string status = "OK";        // gRPC status name
};

struct Percentiles {
  double p50 = 0, p90 = 0, p99 = 0, mean = 0;
  int64_t count = 0;  // values summarised (0: none, e.g. TPOT when every output is one token)
};

struct LevelSummary {
  double rate = 0.0;  // offered requests per second (0: closed loop)
  double seconds = 0.0;
  int64_t requests = 0, succeeded = 0;
  double requests_per_s = 0.0, output_tokens_per_s = 0.0, total_tokens_per_s = 0.0;
  Percentiles ttft, tpot, itl, e2e;
  double goodput = 0.0;        // succeeded requests per second meeting the SLO
  double good_fraction = 0.0;  // share of all requests meeting the SLO
  std::map<std::string, int64_t> errors;
};

Percentiles Summarise(std::vector<double> values);
// `seconds` is the measured span: from the level's start (its arrivals' time 0) to the last
// completion.
LevelSummary Summarise(const std::vector<RequestResult>& results, double rate, double seconds,
                       double slo_ttft, double slo_tpot);

}  // namespace kimi::loadtest
