#include "loadtest/runner.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <iterator>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include <grpcpp/grpcpp.h>

namespace kimi::loadtest {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

class Call;

// The calls in flight, so that Ctrl-C can cancel them. A call is in the set from before it starts
// until its OnDone, which removes it before deleting it; the lock is recursive because gRPC may
// run OnDone inside TryCancel.
class LiveCalls {
 public:
  void Add(Call* c) {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    calls_.insert(c);
  }
  void Remove(Call* c) {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    calls_.erase(c);
  }
  void CancelAll();

 private:
  std::recursive_mutex mu_;
  std::set<Call*> calls_;
};

// One streaming call; reports completion through `on_done`.
class Call : public grpc::ClientReadReactor<v1::GenerateResponse> {
 public:
  Call(v1::Generation::Stub* stub, v1::GenerateRequest req, const RunOptions& o,
       Clock::time_point run_start, double arrival, RequestResult* out, LiveCalls* live,
       std::function<void()> on_done)
      : req_(std::move(req)),
        run_start_(run_start),
        arrival_(arrival),
        out_(out),
        live_(live),
        on_done_(std::move(on_done)) {
    if (!o.api_key.empty()) ctx_.AddMetadata("authorization", "Bearer " + o.api_key);
    ctx_.set_deadline(std::chrono::system_clock::now() +
                      std::chrono::milliseconds(static_cast<int64_t>(o.timeout_seconds * 1000)));
    live_->Add(this);
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
    live_->Remove(this);
    on_done_();
    delete this;
  }
  void Cancel() { ctx_.TryCancel(); }

 private:
  static std::string StatusName(grpc::StatusCode c) {
    static const char* const kNames[] = {"OK",
                                         "CANCELLED",
                                         "UNKNOWN",
                                         "INVALID_ARGUMENT",
                                         "DEADLINE_EXCEEDED",
                                         "NOT_FOUND",
                                         "ALREADY_EXISTS",
                                         "PERMISSION_DENIED",
                                         "RESOURCE_EXHAUSTED",
                                         "FAILED_PRECONDITION",
                                         "ABORTED",
                                         "OUT_OF_RANGE",
                                         "UNIMPLEMENTED",
                                         "INTERNAL",
                                         "UNAVAILABLE",
                                         "DATA_LOSS",
                                         "UNAUTHENTICATED"};
    const auto i = static_cast<size_t>(c);
    return i < std::size(kNames) ? kNames[i] : "STATUS_" + std::to_string(i);
  }
  grpc::ClientContext ctx_;
  v1::GenerateRequest req_;
  v1::GenerateResponse resp_;
  Clock::time_point run_start_;
  double arrival_;
  RequestResult* out_;
  LiveCalls* live_;
  std::function<void()> on_done_;
};

void LiveCalls::CancelAll() {
  std::lock_guard<std::recursive_mutex> lock(mu_);
  const std::vector<Call*> calls(calls_.begin(), calls_.end());
  for (Call* c : calls) {
    if (calls_.count(c) > 0) c->Cancel();  // one that ended meanwhile is gone
  }
}

}  // namespace

std::vector<RequestResult> RunLevel(v1::Generation::Stub* stub, const std::vector<double>& arrivals,
                                    const std::vector<RequestShape>& shapes, const RunOptions& o,
                                    uint64_t seed, const std::atomic<bool>& stop) {
  std::vector<RequestResult> results(arrivals.size());
  std::mt19937_64 rng(seed);
  std::mutex mu;
  std::condition_variable cv;
  int64_t in_flight = 0, done = 0, started = 0;
  LiveCalls live;
  const Clock::time_point start = Clock::now();
  for (size_t i = 0; i < arrivals.size() && !stop.load(); ++i) {
    // Sleep to the arrival in slices, so that Ctrl-C is seen within one.
    const Clock::time_point due = start + std::chrono::duration_cast<Clock::duration>(
                                              std::chrono::duration<double>(arrivals[i]));
    while (!stop.load() && Clock::now() < due) {
      std::this_thread::sleep_until(std::min(due, Clock::now() + std::chrono::milliseconds(50)));
    }
    {
      std::unique_lock<std::mutex> lock(mu);
      while (!stop.load() && in_flight >= o.concurrency) {
        cv.wait_for(lock, std::chrono::milliseconds(50));
      }
      if (stop.load()) break;
      ++in_flight;
    }
    const RequestShape& shape = shapes[i % shapes.size()];
    v1::GenerateRequest req;
    req.set_request_id("loadtest-" + std::to_string(i));
    if (!shape.prompt_text.empty()) {
      req.set_text(shape.prompt_text);
    } else {
      std::uniform_int_distribution<int64_t> id(0, o.vocab - 1);
      for (uint32_t t : o.shared_prefix) req.mutable_token_ids()->add_ids(t);
      for (int64_t t = 0; t < shape.prompt_tokens; ++t) {
        req.mutable_token_ids()->add_ids(static_cast<uint32_t>(id(rng)));
      }
    }
    req.set_max_tokens(static_cast<uint32_t>(shape.max_tokens));
    req.mutable_sampling()->set_temperature(o.temperature);
    req.mutable_sampling()->set_seed(seed + i);
    req.set_ignore_eos(o.ignore_eos);
    results[i].arrival = arrivals[i];
    ++started;
    new Call(stub, std::move(req), o, start, arrivals[i], &results[i], &live, [&] {
      std::lock_guard<std::mutex> lock(mu);
      --in_flight;
      ++done;
      cv.notify_all();
    });
  }
  bool cancelled = false;
  std::unique_lock<std::mutex> lock(mu);
  while (done < started) {
    if (stop.load() && !cancelled) {
      lock.unlock();  // OnDone takes `mu`
      live.CancelAll();
      lock.lock();
      cancelled = true;
    }
    cv.wait_for(lock, std::chrono::milliseconds(50));
  }
  results.resize(static_cast<size_t>(started));
  return results;
}

}  // namespace kimi::loadtest
