// kimi-loadtest: open-loop Poisson load against a kimi-server, at one rate or a sweep of rates.
// Reports throughput (requests/s, tokens/s), TTFT, TPOT, ITL and end-to-end latency at p50/p90/p99,
// goodput under an SLO and errors by status, as a table, JSON and plot-ready CSV.
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <tuple>

#include <grpcpp/grpcpp.h>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "loadtest/runner.h"
#include "nlohmann/json.hpp"
#include "proto/client_credentials.h"
#include "tools/parse_flags.h"
#include <signal.h>

ABSL_FLAG(std::string, target, "127.0.0.1:50051", "kimi-server gRPC address");
ABSL_FLAG(std::string, rates, "1", "offered request rates per second, comma-separated (a sweep)");
ABSL_FLAG(double, duration, 30.0, "seconds of arrivals per rate");
ABSL_FLAG(int64_t, requests, 200, "at most this many requests per rate");
ABSL_FLAG(double, warmup, 2.0, "seconds of warm-up load before the first rate (not counted)");
ABSL_FLAG(int64_t, concurrency, 256, "requests in flight at most; later arrivals wait (and count)");
ABSL_FLAG(std::string, prompt_len, "uniform:32:256", "prompt tokens: fixed:N or uniform:A:B");
ABSL_FLAG(std::string, output_len, "uniform:16:128",
          "output tokens: fixed:N or uniform:A:B (each generated in full: end-of-turn ids are "
          "ignored)");
ABSL_FLAG(int64_t, shared_prefix, 0,
          "tokens every random prompt starts with, the same for the whole run (a system prompt: "
          "what a server's prefix cache serves), before its --prompt_len random ones");
ABSL_FLAG(std::string, jsonl, "",
          "requests from a JSONL file ({\"prompt\": ..., \"max_tokens\": N} or "
          "{\"prompt_tokens\": N, \"output_tokens\": M} per line), cycled");
ABSL_FLAG(double, slo_ttft, 1.0, "goodput SLO: time to first token, seconds");
ABSL_FLAG(double, slo_tpot, 0.1, "goodput SLO: time per output token, seconds");
ABSL_FLAG(std::string, json, "",
          "write the results as JSON to this file (--json=- for stdout; the table then goes to "
          "stderr)");
ABSL_FLAG(std::string, csv, "", "write one CSV row per rate to this file (--csv=- for stdout)");
ABSL_FLAG(uint64_t, seed, 1,
          "workload seed: the same seed, the same prompts (each rate of a sweep its own); a "
          "server's prefix cache serves prompts it has seen, so repeat a run with another seed");
ABSL_FLAG(std::string, api_key, "", "sent as 'authorization: Bearer KEY'");
ABSL_FLAG(std::string, tls_ca, "",
          "TLS to the target (a server with tls.* set): the CA certificates (PEM) its "
          "certificate is checked against; unset: plaintext");
ABSL_FLAG(std::string, tls_cert, "",
          "with --tls_key: this client's certificate (PEM), for a server that asks for one");
ABSL_FLAG(std::string, tls_key, "", "with --tls_cert: this client's private key (PEM)");
ABSL_FLAG(double, temperature, 0.0, "sampling temperature");

namespace kimi::loadtest {
namespace {

// Without values (TPOT and ITL when every output is one token) a percentile is null in JSON,
// "-" in the table and empty in the CSV, never a 0 that reads as a measurement.
nlohmann::ordered_json ToJson(const Percentiles& p) {
  if (p.count == 0)
    return {{"p50", nullptr}, {"p90", nullptr}, {"p99", nullptr}, {"mean", nullptr}};
  return {{"p50", p.p50}, {"p90", p.p90}, {"p99", p.p99}, {"mean", p.mean}};
}

std::string Cell(const Percentiles& p, double v, int width, int precision) {
  return p.count > 0 ? absl::StrFormat("%*.*f", width, precision, v)
                     : absl::StrFormat("%*s", width, "-");
}

std::string CsvCells(const Percentiles& p, std::initializer_list<double> values) {
  std::string out;
  for (double v : values) absl::StrAppend(&out, ",", p.count > 0 ? absl::StrFormat("%g", v) : "");
  return out;
}

nlohmann::ordered_json ToJson(const LevelSummary& s) {
  nlohmann::ordered_json j;
  j["rate"] = s.rate;
  j["seconds"] = s.seconds;
  j["requests"] = s.requests;
  j["succeeded"] = s.succeeded;
  j["requests_per_s"] = s.requests_per_s;
  j["output_tokens_per_s"] = s.output_tokens_per_s;
  j["total_tokens_per_s"] = s.total_tokens_per_s;
  j["ttft_s"] = ToJson(s.ttft);
  j["tpot_s"] = ToJson(s.tpot);
  j["itl_s"] = ToJson(s.itl);
  j["e2e_s"] = ToJson(s.e2e);
  j["goodput_requests_per_s"] = s.goodput;
  j["good_fraction"] = s.good_fraction;
  j["errors"] = s.errors;
  return j;
}

int Fail(const std::string& m) {
  std::fprintf(stderr, "kimi-loadtest: %s\n", m.c_str());
  return 2;
}

// Set by the first SIGINT/SIGTERM: the run stops, cancels what is in flight and writes the rates
// it finished (a second signal ends the process at once).
std::atomic<bool> g_interrupted{false};
extern "C" void OnInterrupt(int) { g_interrupted.store(true); }

// A finite number in (lo, hi] (or [lo, hi] when `closed`): NaN and infinity pass `v > 0`.
bool InRange(double v, double lo, double hi, bool closed = false) {
  return std::isfinite(v) && (closed ? v >= lo : v > lo) && v <= hi;
}

int Main() {
  std::vector<double> rates;
  for (absl::string_view r : absl::StrSplit(absl::GetFlag(FLAGS_rates), ',')) {
    double v;
    if (!absl::SimpleAtod(r, &v) || !InRange(v, 0, 1e6)) {
      return Fail("--rates: positive numbers up to 1e6, e.g. 1,2,4");
    }
    rates.push_back(v);
  }
  if (rates.empty()) return Fail("--rates: at least one rate");
  if (!InRange(absl::GetFlag(FLAGS_duration), 0, 86400)) {
    return Fail("--duration: seconds in (0, 86400]");
  }
  if (absl::GetFlag(FLAGS_requests) < 1) return Fail("--requests: at least 1");
  if (absl::GetFlag(FLAGS_concurrency) < 1) return Fail("--concurrency: at least 1");
  if (!InRange(absl::GetFlag(FLAGS_warmup), 0, 3600, /*closed=*/true)) {
    return Fail("--warmup: seconds in [0, 3600]");
  }
  if (!InRange(absl::GetFlag(FLAGS_slo_ttft), 0, 1e6) ||
      !InRange(absl::GetFlag(FLAGS_slo_tpot), 0, 1e6)) {
    return Fail("--slo_ttft and --slo_tpot: seconds above 0");
  }
  if (!InRange(absl::GetFlag(FLAGS_temperature), 0, 100, /*closed=*/true)) {
    return Fail("--temperature: in [0, 100]");
  }
  if (absl::GetFlag(FLAGS_tls_cert).empty() != absl::GetFlag(FLAGS_tls_key).empty()) {
    return Fail("--tls_cert and --tls_key go together");
  }
  if (!absl::GetFlag(FLAGS_tls_cert).empty() && absl::GetFlag(FLAGS_tls_ca).empty()) {
    return Fail("--tls_cert: only with --tls_ca (TLS to the target)");
  }
  const std::string json_path = absl::GetFlag(FLAGS_json), csv_path = absl::GetFlag(FLAGS_csv);
  if (json_path == "-" && csv_path == "-") {
    return Fail("--json=- and --csv=-: only one of them can go to stdout");
  }
  // The output paths are checked before the run (opened to append, which changes nothing), so
  // that one that cannot be written fails now rather than losing the results at the end.
  for (const auto& [flag, path] :
       {std::pair{"--json", &json_path}, std::pair{"--csv", &csv_path}}) {
    if (path->empty() || *path == "-") continue;
    if (!std::ofstream(*path, std::ios::app).good()) {
      return Fail(absl::StrCat(flag, ": cannot write ", *path, ": ", std::strerror(errno)));
    }
  }
  // With the JSON or the CSV on stdout, the table goes to stderr.
  FILE* table = json_path == "-" || csv_path == "-" ? stderr : stdout;
  const int64_t shared_prefix = absl::GetFlag(FLAGS_shared_prefix);
  if (shared_prefix < 0 || shared_prefix > kMaxLength) {
    return Fail(absl::StrCat("--shared_prefix: tokens in [0, ", kMaxLength, "]"));
  }
  std::vector<RequestShape> shapes;
  if (!absl::GetFlag(FLAGS_jsonl).empty()) {
    auto s = ReadJsonl(absl::GetFlag(FLAGS_jsonl));
    if (!s.ok()) return Fail(std::string(s.status().message()));
    shapes = std::move(*s);
    const bool texts = std::any_of(shapes.begin(), shapes.end(),
                                   [](const RequestShape& s) { return !s.prompt_text.empty(); });
    if (shared_prefix > 0 && texts) {
      return Fail("--shared_prefix: only for random prompts (JSONL lines with prompt_tokens)");
    }
  } else {
    auto p = ParseLengthDist(absl::GetFlag(FLAGS_prompt_len), "prompt_len");
    auto o = ParseLengthDist(absl::GetFlag(FLAGS_output_len), "output_len");
    if (!p.ok()) return Fail(std::string(p.status().message()));
    if (!o.ok()) return Fail(std::string(o.status().message()));
    std::mt19937_64 rng(absl::GetFlag(FLAGS_seed));
    for (int i = 0; i < 4096; ++i) shapes.push_back({"", p->Draw(rng), o->Draw(rng)});
  }
  auto credentials = ClientCredentials({{"--tls_ca", absl::GetFlag(FLAGS_tls_ca)},
                                        {"--tls_cert", absl::GetFlag(FLAGS_tls_cert)},
                                        {"--tls_key", absl::GetFlag(FLAGS_tls_key)}});
  if (!credentials.ok()) return Fail(std::string(credentials.status().message()));
  auto channel = grpc::CreateChannel(absl::GetFlag(FLAGS_target), *credentials);
  auto stub = v1::Generation::NewStub(channel);
  RunOptions o;
  o.concurrency = absl::GetFlag(FLAGS_concurrency);
  o.api_key = absl::GetFlag(FLAGS_api_key);
  o.temperature = static_cast<float>(absl::GetFlag(FLAGS_temperature));
  {
    grpc::ClientContext ctx;
    if (!o.api_key.empty()) ctx.AddMetadata("authorization", "Bearer " + o.api_key);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::ModelInfo info;
    const grpc::Status s = stub->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info);
    if (!s.ok()) {
      const bool unreachable = s.error_code() == grpc::StatusCode::UNAVAILABLE ||
                               s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
      return Fail(absl::StrCat(unreachable ? "cannot reach " : "GetModelInfo refused by ",
                               absl::GetFlag(FLAGS_target), ": ", s.error_message()));
    }
    o.vocab = info.vocab_size() - 256;  // base ranks only: no special tokens in random prompts
    // Random prompts the server would refuse (and that would fill this process's memory first).
    int64_t longest = 0;
    for (const RequestShape& s : shapes) longest = std::max(longest, s.prompt_tokens);
    longest += shared_prefix;
    if (info.context_limit() > 0 && longest >= static_cast<int64_t>(info.context_limit())) {
      return Fail(absl::StrCat("prompts of ", longest, " tokens reach the server's context limit (",
                               info.context_limit(), "): choose shorter --prompt_len or lines"));
    }
    // One prefix for the whole run, every rate: as a deployment's system prompt.
    std::mt19937_64 prefix_rng(absl::GetFlag(FLAGS_seed) ^ 0x9e3779b97f4a7c15ull);
    std::uniform_int_distribution<int64_t> id(0, o.vocab - 1);
    for (int64_t i = 0; i < shared_prefix; ++i) {
      o.shared_prefix.push_back(static_cast<uint32_t>(id(prefix_rng)));
    }
    std::fprintf(stderr, "target %s: %s (%s), vocabulary %u\n", absl::GetFlag(FLAGS_target).c_str(),
                 info.model_name().c_str(), info.model_type().c_str(), info.vocab_size());
  }
  struct sigaction on_interrupt = {};
  on_interrupt.sa_handler = OnInterrupt;
  on_interrupt.sa_flags = SA_RESETHAND;  // a second signal ends the process at once
  sigaction(SIGINT, &on_interrupt, nullptr);
  sigaction(SIGTERM, &on_interrupt, nullptr);
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  if (absl::GetFlag(FLAGS_warmup) > 0) {
    std::mt19937_64 rng(seed ^ 0x5eed);
    auto arrivals = PoissonArrivals(rates[0], absl::GetFlag(FLAGS_warmup), 1 << 20, rng);
    RunLevel(stub.get(), arrivals, shapes, o, seed ^ 0x5eed, g_interrupted);
  }
  std::vector<LevelSummary> levels;
  std::fprintf(table, "%8s %8s %9s | %24s | %24s | %16s | %24s | %8s %s\n", "rate", "req/s",
               "out tok/s", "TTFT p50/p90/p99 (s)", "TPOT p50/p90/p99 (s)", "ITL p50/p99 (s)",
               "e2e p50/p90/p99 (s)", "goodput", "errors");
  for (size_t level = 0; level < rates.size() && !g_interrupted.load(); ++level) {
    const double rate = rates[level];
    std::mt19937_64 rng(seed + static_cast<uint64_t>(rate * 1000));
    auto arrivals = PoissonArrivals(rate, absl::GetFlag(FLAGS_duration),
                                    absl::GetFlag(FLAGS_requests), rng);
    if (arrivals.empty()) {
      std::fprintf(stderr, "kimi-loadtest: rate %g: no arrival within --duration %g s; skipped\n",
                   rate, absl::GetFlag(FLAGS_duration));
      continue;
    }
    const auto t0 = std::chrono::steady_clock::now();
    // Each rate its own prompts: with the same ones, the prefix cache would serve a later rate's
    // prompts from the earlier rate's snapshots and flatter its TTFT.
    auto results =
        RunLevel(stub.get(), arrivals, shapes, o, seed + 7919 * (level + 1), g_interrupted);
    if (g_interrupted.load()) {  // cut short, its requests cancelled: not a measurement
      std::fprintf(stderr,
                   "kimi-loadtest: interrupted during rate %g; writing the %zu rates done\n", rate,
                   levels.size());
      break;
    }
    const double span = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    LevelSummary s = Summarise(results, rate, span, absl::GetFlag(FLAGS_slo_ttft),
                               absl::GetFlag(FLAGS_slo_tpot));
    std::string errors;
    for (const auto& [k, v] : s.errors) errors += absl::StrFormat("%s=%d ", k, v);
    std::fprintf(table, "%8.2f %8.2f %9.1f | %s %s %s | %s %s %s | %s %s | %s %s %s | %8.2f %s\n",
                 rate, s.requests_per_s, s.output_tokens_per_s,
                 Cell(s.ttft, s.ttft.p50, 7, 3).c_str(), Cell(s.ttft, s.ttft.p90, 7, 3).c_str(),
                 Cell(s.ttft, s.ttft.p99, 8, 3).c_str(), Cell(s.tpot, s.tpot.p50, 7, 4).c_str(),
                 Cell(s.tpot, s.tpot.p90, 7, 4).c_str(), Cell(s.tpot, s.tpot.p99, 8, 4).c_str(),
                 Cell(s.itl, s.itl.p50, 7, 4).c_str(), Cell(s.itl, s.itl.p99, 8, 4).c_str(),
                 Cell(s.e2e, s.e2e.p50, 7, 3).c_str(), Cell(s.e2e, s.e2e.p90, 7, 3).c_str(),
                 Cell(s.e2e, s.e2e.p99, 8, 3).c_str(), s.goodput,
                 errors.empty() ? "-" : errors.c_str());
    std::fflush(table);
    levels.push_back(s);
  }
  // The knee: the highest offered rate at which at least 90% of requests still meet the SLO.
  double knee = 0.0;
  for (const LevelSummary& s : levels) {
    if (s.good_fraction >= 0.9) knee = std::max(knee, s.rate);
  }
  if (levels.size() > 1) {
    std::fprintf(table, "knee: %s\n",
                 knee > 0 ? absl::StrFormat("%.2f req/s (>= 90%% of requests meet "
                                            "TTFT <= %.2fs and TPOT <= %.3fs)",
                                            knee, absl::GetFlag(FLAGS_slo_ttft),
                                            absl::GetFlag(FLAGS_slo_tpot))
                                .c_str()
                          : "below the lowest rate");
  }
  // Written even when interrupted before a rate finished (no levels, "interrupted": true): the
  // check above has created the file, and a script must find JSON in it, not nothing.
  if (!json_path.empty()) {
    nlohmann::ordered_json j;
    j["target"] = absl::GetFlag(FLAGS_target);
    j["shared_prefix"] = shared_prefix;
    j["slo"] = {{"ttft_s", absl::GetFlag(FLAGS_slo_ttft)}, {"tpot_s", absl::GetFlag(FLAGS_slo_tpot)}};
    j["levels"] = nlohmann::ordered_json::array();
    for (const auto& s : levels) j["levels"].push_back(ToJson(s));
    j["knee_rate"] = knee;
    j["interrupted"] = g_interrupted.load();
    std::ofstream json_file;
    if (json_path != "-") json_file.open(json_path, std::ios::trunc);
    (json_path == "-" ? std::cout : json_file) << j.dump(2) << "\n";
  }
  if (!csv_path.empty()) {
    std::ofstream csv_file;
    if (csv_path != "-") csv_file.open(csv_path, std::ios::trunc);
    std::ostream& csv = csv_path == "-" ? std::cout : csv_file;
    csv << "rate,requests_per_s,output_tokens_per_s,ttft_p50,ttft_p90,ttft_p99,tpot_p50,tpot_p90,"
           "tpot_p99,itl_p50,itl_p99,e2e_p50,e2e_p90,e2e_p99,goodput,errors\n";
    for (const auto& s : levels) {
      int64_t errors = 0;
      for (const auto& [k, v] : s.errors) errors += v;
      csv << absl::StrFormat("%g,%g,%g", s.rate, s.requests_per_s, s.output_tokens_per_s)
          << CsvCells(s.ttft, {s.ttft.p50, s.ttft.p90, s.ttft.p99})
          << CsvCells(s.tpot, {s.tpot.p50, s.tpot.p90, s.tpot.p99})
          << CsvCells(s.itl, {s.itl.p50, s.itl.p99})
          << CsvCells(s.e2e, {s.e2e.p50, s.e2e.p90, s.e2e.p99})
          << absl::StrFormat(",%g,%d\n", s.goodput, errors);
    }
  }
  if (g_interrupted.load()) return 130;  // as a shell reports an interrupted command
  int64_t succeeded = 0;
  for (const LevelSummary& s : levels) succeeded += s.succeeded;
  if (succeeded == 0) {  // nothing measured: a script must not take this for a result
    std::fprintf(stderr, "kimi-loadtest: no request succeeded\n");
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace kimi::loadtest

int main(int argc, char** argv) {
  kimi::tools::ParseFlags(
      argc, argv,
      "Open-loop Poisson load against kimi-server.\n  kimi-loadtest --target 127.0.0.1:50051 "
      "--rates 1,2,4,8 --duration 30 [--json out.json] [--csv out.csv]");
  return kimi::loadtest::Main();
}
