#include "loadtest/stats.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace kimi::loadtest {

Percentiles Summarise(std::vector<double> v) {
  Percentiles p;
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  // Nearest-rank percentiles.
  auto at = [&](double q) {
    const size_t i = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size()))) - 1;
    return v[std::min(i, v.size() - 1)];
  };
  p.p50 = at(0.50);
  p.p90 = at(0.90);
  p.p99 = at(0.99);
  p.mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  p.count = static_cast<int64_t>(v.size());
  return p;
}

LevelSummary Summarise(const std::vector<RequestResult>& results, double rate, double seconds,
                       double slo_ttft, double slo_tpot) {
  LevelSummary s;
  s.rate = rate;
  s.seconds = seconds;
  std::vector<double> ttft, tpot, itl, e2e;
  int64_t out_tokens = 0, all_tokens = 0, good = 0;
  for (const RequestResult& r : results) {
    ++s.requests;
    if (r.status != "OK") {
      ++s.errors[r.status];
      continue;
    }
    ++s.succeeded;
    out_tokens += r.output_tokens;
    all_tokens += r.output_tokens + r.prompt_tokens;
    e2e.push_back(r.end);
    double tp = 0.0;
    if (r.first_token >= 0) {
      ttft.push_back(r.first_token);
      if (r.output_tokens > 1) {
        tp = (r.end - r.first_token) / static_cast<double>(r.output_tokens - 1);
        tpot.push_back(tp);
      }
    }
    for (size_t i = 1; i < r.token_times.size(); ++i) {
      itl.push_back(r.token_times[i] - r.token_times[i - 1]);
    }
    if (r.first_token >= 0 && r.first_token <= slo_ttft && tp <= slo_tpot) ++good;
  }
  if (seconds > 0) {
    s.requests_per_s = static_cast<double>(s.succeeded) / seconds;
    s.output_tokens_per_s = static_cast<double>(out_tokens) / seconds;
    s.total_tokens_per_s = static_cast<double>(all_tokens) / seconds;
    s.goodput = static_cast<double>(good) / seconds;
  }
  if (s.requests > 0) s.good_fraction = static_cast<double>(good) / static_cast<double>(s.requests);
  s.ttft = Summarise(ttft);
  s.tpot = Summarise(tpot);
  s.itl = Summarise(itl);
  s.e2e = Summarise(e2e);
  return s;
}

}  // namespace kimi::loadtest
