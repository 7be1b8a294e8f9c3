#include "loadtest/runner.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <random>
#include <thread>

namespace kimi::loadtest {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// One streaming call; reports completion through `on_done`.
class Call : public grpc::ClientReadReactor<v1::GenerateResponse> {
 public:
  Call(v1::Generation::Stub* stub, v1::GenerateRequest req, const RunOptions& o,
       Clock::time_point run_start, double arrival, RequestResult* out,
       std::function<void()> on_done)
      : req_(std::move(req)), run_start_(run_start), arrival_(arrival), out_(out),
        on_done_(std::move(on_done)) {
    if (!o.api_key.empty()) ctx_.AddMetadata("authorization", "Bearer " + o.api_key);
    ctx_.set_deadline(std::chrono::system_clock::now() +
                      std::chrono::milliseconds(static_cast<int64_t>(o.timeout_seconds * 1000)));
    stub->async()->Generate(&ctx_, &req_, this);
    StartRead(&resp_);
    StartCall();
  }
  void OnReadDone(bool ok) override {
    if (!ok) return;
    const double t = Since(run_start_) - arrival_;
    for (int i = 0; i < resp_.token_ids_size(); ++i) {
      if (out_->first_token < 0) out_->first_token = t;
      out_->token_times.push_back(t);
    }
    if (resp_.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
      out_->prompt_tokens = resp_.usage().prompt_tokens();
      out_->output_tokens = resp_.usage().completion_tokens();
    }
    StartRead(&resp_);
  }
  void OnDone(const grpc::Status& s) override {
    out_->end = Since(run_start_) - arrival_;
    if (!s.ok()) out_->status = StatusName(s.error_code());
    on_done_();
    delete this;
  }

 private:
  static std::string StatusName(grpc::StatusCode c) {
    switch (c) {
      case grpc::StatusCode::CANCELLED: return "CANCELLED";
      case grpc::StatusCode::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
      case grpc::StatusCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
      case grpc::StatusCode::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
      case grpc::StatusCode::UNAVAILABLE: return "UNAVAILABLE";
      case grpc::StatusCode::UNAUTHENTICATED: return "UNAUTHENTICATED";
      case grpc::StatusCode::INTERNAL: return "INTERNAL";
      default: return "STATUS_" + std::to_string(static_cast<int>(c));
    }
  }
  grpc::ClientContext ctx_;
  v1::GenerateRequest req_;
  v1::GenerateResponse resp_;
  Clock::time_point run_start_;
  double arrival_;
  RequestResult* out_;
  std::function<void()> on_done_;
};

}  // namespace

std::vector<RequestResult> RunLevel(v1::Generation::Stub* stub, const std::vector<double>& arrivals,
                                    const std::vector<RequestShape>& shapes,
                                    const RunOptions& o, uint64_t seed) {
  std::vector<RequestResult> results(arrivals.size());
  std::mt19937_64 rng(seed);
  std::mutex mu;
  std::condition_variable cv;
  int64_t in_flight = 0, done = 0;
  const Clock::time_point start = Clock::now();
  for (size_t i = 0; i < arrivals.size(); ++i) {
    std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(
                                              std::chrono::duration<double>(arrivals[i])));
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return in_flight < o.concurrency; });
      ++in_flight;
    }
    const RequestShape& shape = shapes[i % shapes.size()];
    v1::GenerateRequest req;
    req.set_request_id("loadtest-" + std::to_string(i));
    if (!shape.prompt_text.empty()) {
      req.set_text(shape.prompt_text);
    } else {
      std::uniform_int_distribution<int64_t> id(0, o.vocab - 1);
      for (int64_t t = 0; t < shape.prompt_tokens; ++t) {
        req.mutable_token_ids()->add_ids(static_cast<uint32_t>(id(rng)));
      }
    }
    req.set_max_tokens(static_cast<uint32_t>(shape.max_tokens));
    req.mutable_sampling()->set_temperature(o.temperature);
    req.mutable_sampling()->set_seed(seed + i);
    req.set_ignore_eos(o.ignore_eos);
    results[i].arrival = arrivals[i];
    new Call(stub, std::move(req), o, start, arrivals[i], &results[i], [&] {
      std::lock_guard<std::mutex> lock(mu);
      --in_flight;
      ++done;
      cv.notify_all();
    });
  }
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done == static_cast<int64_t>(arrivals.size()); });
  return results;
}

}  // namespace kimi::loadtest
