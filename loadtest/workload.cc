#include "loadtest/workload.h"

#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"

namespace kimi::loadtest {

int64_t LengthDist::Draw(std::mt19937_64& rng) const {
  if (lo == hi) return lo;
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

absl::StatusOr<LengthDist> ParseLengthDist(const std::string& spec, const char* flag) {
  std::vector<std::string> parts = absl::StrSplit(spec, ':');
  LengthDist d;
  auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", flag, ": expected fixed:N or uniform:A:B with 1 <= A <= B <= ", kMaxLength,
        ", got \"", spec, "\""));
  };
  if (parts.size() == 2 && parts[0] == "fixed" && absl::SimpleAtoi(parts[1], &d.lo)) {
    d.hi = d.lo;
  } else if (parts.size() == 3 && parts[0] == "uniform" && absl::SimpleAtoi(parts[1], &d.lo) &&
             absl::SimpleAtoi(parts[2], &d.hi)) {
  } else {
    return bad();
  }
  if (d.lo < 1 || d.hi < d.lo || d.hi > kMaxLength) return bad();
  return d;
}

absl::StatusOr<std::vector<RequestShape>> ReadJsonl(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::vector<RequestShape> out;
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    auto bad = [&](const char* what) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", n, ": ", what));
    };
    if (!j.is_object()) return bad("not a JSON object");
    RequestShape r;
    if (j.contains("prompt") && j["prompt"].is_string()) {
      r.prompt_text = j["prompt"].get<std::string>();
      if (r.prompt_text.empty()) return bad("\"prompt\" is empty");
    } else if (j.contains("prompt_tokens") && j["prompt_tokens"].is_number_integer()) {
      r.prompt_tokens = j["prompt_tokens"].get<int64_t>();
      if (r.prompt_tokens < 1 || r.prompt_tokens > kMaxLength) {
        return bad("prompt_tokens must be in [1, 4294967295]");
      }
    } else {
      return bad("needs \"prompt\" (string) or \"prompt_tokens\" (integer)");
    }
    const char* out_key = j.contains("max_tokens") ? "max_tokens" : "output_tokens";
    // Past int64 a number reads as negative here (or as a float: not an integer): out of range.
    if (!j.contains(out_key) || !j[out_key].is_number_integer() || j[out_key].get<int64_t>() < 1 ||
        j[out_key].get<int64_t>() > kMaxLength) {
      return bad("needs \"max_tokens\" or \"output_tokens\" (integer in [1, 4294967295])");
    }
    r.max_tokens = j[out_key].get<int64_t>();
    out.push_back(std::move(r));
  }
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no requests"));
  return out;
}

std::vector<double> PoissonArrivals(double rate, double duration, int64_t max_requests,
                                    std::mt19937_64& rng) {
  std::vector<double> t;
  std::exponential_distribution<double> gap(rate);
  double now = 0.0;
  for (;;) {
    now += gap(rng);
    if (now > duration || static_cast<int64_t>(t.size()) >= max_requests) break;
    t.push_back(now);
  }
  return t;
}

}  // namespace kimi::loadtest
