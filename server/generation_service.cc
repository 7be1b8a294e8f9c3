#include "server/generation_service.h"

#include <algorithm>
#include <deque>
#include <mutex>
#include <string_view>

#include <grpcpp/support/byte_buffer.h>
#include <spdlog/spdlog.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "server/status_map.h"
#include "server/validate.h"
#include "tokenizer/detokenizer.h"

namespace kimi::server {
namespace {

using sched::Clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

grpc::ByteBuffer Serialize(const google::protobuf::Message& m) {
  const std::string bytes = m.SerializeAsString();
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

bool Parse(const grpc::ByteBuffer* buffer, google::protobuf::Message* m) {
  std::vector<grpc::Slice> slices;
  if (!buffer->Dump(&slices).ok()) return false;
  std::string bytes;
  for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return m->ParseFromString(bytes);
}

v1::FinishReason ToProto(sched::FinishReason r) {
  switch (r) {
    case sched::FinishReason::kStop:
      return v1::FINISH_REASON_STOP;
    case sched::FinishReason::kLength:
      return v1::FINISH_REASON_LENGTH;
    case sched::FinishReason::kCancelled:
      return v1::FINISH_REASON_CANCELLED;
    case sched::FinishReason::kError:
      return v1::FINISH_REASON_ERROR;
    case sched::FinishReason::kNone:
      break;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

// Why a request that finished CANCELLED with `detail` was cancelled, as
// kimi_request_cancellations_total's reason names it; the final status follows from it.
const char* CancellationReason(const std::string& detail) {
  if (detail == "deadline exceeded") return "deadline";
  if (detail.find("shut down") != std::string::npos) return "shutdown";
  return "client_cancel";
}

// The RPC status a stream ends with, given how the request finished.
grpc::Status FinalStatus(sched::FinishReason r, const std::string& detail) {
  switch (r) {
    case sched::FinishReason::kStop:
    case sched::FinishReason::kLength:
      return grpc::Status::OK;
    case sched::FinishReason::kCancelled: {
      const std::string_view reason = CancellationReason(detail);
      if (reason == "deadline") return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, detail);
      if (reason == "shutdown") {
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, detail + "; retry on another replica");
      }
      return grpc::Status(grpc::StatusCode::CANCELLED, detail);
    }
    case sched::FinishReason::kError:
    case sched::FinishReason::kNone:
      break;
  }
  return grpc::Status(grpc::StatusCode::INTERNAL, detail);
}

class GenerateStream;

// How long before the server's copy of a call's deadline a cancel still counts as the deadline's:
// the client's timer starts before the call reaches the server, by as much as the call took to
// arrive and be read (tens of ms, more on a busy host; 50 ms misnamed some under a loaded test).
// A call's margin lies between these (NearDeadline).
constexpr std::chrono::milliseconds kDeadlineMargin{250}, kMinDeadlineMargin{25};

// Shared between the reactor (gRPC threads) and the sink (engine thread); outlives either.
struct StreamShared {
  std::mutex mu;
  GenerateStream* reactor = nullptr;  // null once gRPC is done with the call
  std::deque<grpc::ByteBuffer> pending;
  bool writing = false;
  bool final_queued = false;  // the last message is in `pending`
  bool finish_called = false;
  grpc::Status final_status;
};

class GenerateStream : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  GenerateStream(Backend* b, grpc::CallbackServerContext* ctx)
      : backend_(b), ctx_(ctx), arrived_(std::chrono::system_clock::now()) {
    shared_ = std::make_shared<StreamShared>();
    shared_->reactor = this;
  }

  void Start(const grpc::ByteBuffer* request);

  // Engine thread, with shared_->mu held: queue a message (and the final status), write if idle.
  void EnqueueLocked(grpc::ByteBuffer message, bool final, grpc::Status status) {
    if (shared_->finish_called) return;
    shared_->pending.push_back(std::move(message));
    if (final) {
      shared_->final_queued = true;
      shared_->final_status = std::move(status);
    }
    PumpLocked();
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->writing = false;
    if (!shared_->pending.empty()) shared_->pending.pop_front();
    if (!ok) {  // the client is gone (or its deadline passed): stop the request, end the call
      if (!id_.empty() && backend_->loop) {
        backend_->loop->Cancel(id_, NearDeadline() ? "deadline exceeded" : "client went away");
      }
      FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "write failed"));
      return;
    }
    PumpLocked();
  }

  // A client whose own deadline passes resets the stream before the server's copy of the deadline
  // (taken when the call arrived) passes: a cancel or a failed write this close to it is the
  // deadline's. The cancellation is counted with the request's final event, by its reason.
  // The margin is at most a quarter of the call's whole time, so that a client cancelling a call
  // with a deadline of 250 ms or less is not always taken for its deadline, and at least
  // kMinDeadlineMargin: the server's copy of the deadline runs later than the client's by the
  // call's way in, which on a loaded host passed a quarter of a 20-ms call (one such deadline in
  // eight counted as the client's, e2e.server.cancel with both cores busy).
  bool NearDeadline() const {
    const auto deadline = ctx_->deadline();
    if (deadline == std::chrono::system_clock::time_point::max()) return false;
    using Duration = std::chrono::system_clock::duration;
    const Duration margin =
        std::clamp<Duration>((deadline - arrived_) / 4, kMinDeadlineMargin, kDeadlineMargin);
    return deadline <= std::chrono::system_clock::now() + margin;
  }

  void OnCancel() override {
    const bool deadline = NearDeadline();
    if (!id_.empty() && backend_->loop) {
      backend_->loop->Cancel(id_, deadline ? "deadline exceeded" : "cancelled by client");
    }
    std::lock_guard<std::mutex> lock(shared_->mu);
    FinishLocked(grpc::Status(deadline ? grpc::StatusCode::DEADLINE_EXCEEDED
                                       : grpc::StatusCode::CANCELLED,
                              deadline ? "deadline exceeded" : "cancelled by client"));
  }

  void OnDone() override {
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      shared_->reactor = nullptr;
    }
    delete this;
  }

  void Reject(const absl::Status& s, const char* what) {
    if (backend_->metrics) backend_->metrics->OnRejected(what);
    // At debug level: a flood of bad requests must not flood the log at info; the counter has them.
    spdlog::debug("request refused from {}: {} {}", ctx_->peer(), what,
                  absl::Utf8SafeCEscape(std::string(s.message())));
    std::lock_guard<std::mutex> lock(shared_->mu);
    FinishLocked(ToGrpcStatus(s));
  }

  std::shared_ptr<StreamShared> shared() { return shared_; }

 private:
  void PumpLocked() {
    if (shared_->finish_called || shared_->writing) return;
    if (!shared_->pending.empty()) {
      shared_->writing = true;
      StartWrite(&shared_->pending.front());
    } else if (shared_->final_queued) {
      FinishLocked(shared_->final_status);
    }
  }
  void FinishLocked(grpc::Status s) {
    if (shared_->finish_called) return;
    shared_->finish_called = true;
    Finish(std::move(s));
  }

  Backend* backend_;
  grpc::CallbackServerContext* ctx_;
  std::chrono::system_clock::time_point arrived_;  // when the call reached the service
  std::shared_ptr<StreamShared> shared_;
  std::string id_;
};

// Receives the engine's events for one request and turns them into kimi.v1 messages.
class StreamSink : public sched::RequestSink {
 public:
  StreamSink(Backend* b, std::shared_ptr<StreamShared> shared, std::string id, std::string client,
             std::string prompt_text)
      : backend_(b),
        shared_(std::move(shared)),
        id_(std::move(id)),
        client_(std::move(client)),
        prompt_text_(std::move(prompt_text)),
        start_(Clock::now()) {}

  void OnEvent(sched::StreamEvent e) override {
    Metrics* metrics = backend_->metrics;
    const Clock::time_point now = Clock::now();
    if (!e.tokens.empty()) {
      if (tokens_ == 0) {
        ttft_ = Since(start_);
        if (metrics) metrics->OnFirstToken(ttft_, e.queue_seconds);
      } else if (metrics) {
        metrics->OnToken(std::chrono::duration<double>(now - last_token_).count());
      }
      last_token_ = now;
      tokens_ += static_cast<int64_t>(e.tokens.size());
    }
    v1::GenerateResponse r;
    r.set_text(e.text);
    for (const auto& t : e.tokens) {
      r.add_token_ids(static_cast<uint32_t>(t.token));
      if (want_logprobs_) {
        v1::TokenLogprob* lp = r.add_logprobs();
        lp->set_token_id(static_cast<uint32_t>(t.token));
        lp->set_logprob(t.logprob);
        for (const auto& [id, v] : t.top) {
          v1::TopLogprob* top = lp->add_top();
          top->set_token_id(static_cast<uint32_t>(id));
          top->set_logprob(v);
        }
      }
    }
    const bool final = e.finish != sched::FinishReason::kNone;
    grpc::Status status;
    if (final) {
      r.set_finish_reason(ToProto(e.finish));
      r.mutable_usage()->set_prompt_tokens(static_cast<uint32_t>(e.prompt_tokens));
      r.mutable_usage()->set_completion_tokens(static_cast<uint32_t>(e.completion_tokens));
      status = e.rejected.ok() ? FinalStatus(e.finish, e.detail) : ToGrpcStatus(e.rejected);
      const double total = Since(start_);
      if (metrics) {
        metrics->OnFinished(e.finish, e.prompt_tokens, e.completion_tokens, total);
        // Counted here, once per cancelled request, whichever noticed first (the client's
        // cancel, the scheduler's deadline check, the drain).
        if (e.finish == sched::FinishReason::kCancelled) {
          metrics->OnCancelled(CancellationReason(e.detail));
        }
      }
      // What clients send is escaped (newlines, quotes, control bytes), so each request stays one
      // line and no client can write a line of its own into the log.
      spdlog::info(
          "request {} client_id=\"{}\" prompt_tokens={} completion_tokens={} "
          "cached_tokens={} ttft={} duration={:.3f}s finish={} {}{}",
          id_, absl::Utf8SafeCEscape(client_), e.prompt_tokens, e.completion_tokens,
          e.cached_tokens, tokens_ > 0 ? fmt::format("{:.3f}s", ttft_) : std::string("-"), total,
          sched::FinishReasonName(e.finish), e.detail,
          backend_->config.log_prompts
              ? absl::StrCat(" prompt=\"", absl::Utf8SafeCEscape(prompt_text_), "\"")
              : "");
    }
    std::lock_guard<std::mutex> lock(shared_->mu);
    if (shared_->reactor) shared_->reactor->EnqueueLocked(Serialize(r), final, std::move(status));
  }

  bool want_logprobs_ = false;

 private:
  Backend* backend_;
  std::shared_ptr<StreamShared> shared_;
  std::string id_, client_, prompt_text_;
  Clock::time_point start_, last_token_;
  int64_t tokens_ = 0;
  double ttft_ = 0.0;
};

void GenerateStream::Start(const grpc::ByteBuffer* request) {
  internal::GenerateRequest req;
  if (!Parse(request, &req)) {
    if (!request->Valid() || ctx_->IsCancelled()) {  // gone before its request was read
      std::lock_guard<std::mutex> lock(shared_->mu);
      FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled before the request"));
      return;
    }
    Reject(absl::InvalidArgumentError("request: not a valid kimi.v1.GenerateRequest"),
           "INVALID_ARGUMENT");
    return;
  }
  Backend& b = *backend_;
  auto v = ValidateGenerate(req, b.config, b.model->config(), *b.tokenizer);
  if (!v.ok()) {
    Reject(v.status(), "INVALID_ARGUMENT");
    return;
  }
  v->spec.id = absl::StrCat("r", b.next_id.fetch_add(1));
  const auto deadline = ctx_->deadline();
  if (deadline != std::chrono::system_clock::time_point::max()) {
    v->spec.deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                          deadline - std::chrono::system_clock::now());
  }
  id_ = v->spec.id;
  auto sink = std::make_shared<StreamSink>(backend_, shared_, id_, v->client_id,
                                           std::move(v->prompt_text));
  sink->want_logprobs_ = v->spec.sampling.want_logprobs;
  const absl::Status s = b.loop->Submit(std::move(v->spec), std::move(v->stop_strings), sink);
  if (!s.ok()) {
    id_.clear();
    Reject(s, s.code() == absl::StatusCode::kResourceExhausted ? "RESOURCE_EXHAUSTED"
                                                                : "UNAVAILABLE");
  }
}

}  // namespace

absl::Status GenerationService::Admit(grpc::CallbackServerContext* context) const {
  if (backend_->keys.enabled()) {
    const auto& md = context->client_metadata();
    auto it = md.find("authorization");
    const std::string value = it == md.end() ? "" : std::string(it->second.data(), it->second.size());
    if (absl::Status s = backend_->keys.Check(value); !s.ok()) {
      if (backend_->metrics) backend_->metrics->OnAuthFailure();
      return s;
    }
  }
  if (!backend_->ready.load()) return absl::UnavailableError("model is loading; not serving yet");
  if (backend_->loop->draining()) return absl::UnavailableError("server is shutting down");
  return absl::OkStatus();
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* GenerationService::Generate(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  auto* stream = new GenerateStream(backend_, context);
  if (absl::Status s = Admit(context); !s.ok()) {
    stream->Reject(s, s.code() == absl::StatusCode::kUnauthenticated ? "UNAUTHENTICATED"
                                                                     : "UNAVAILABLE");
  } else {
    stream->Start(request);
  }
  return stream;
}

grpc::ServerUnaryReactor* GenerationService::Tokenize(grpc::CallbackServerContext* context,
                                                      const grpc::ByteBuffer* request,
                                                      grpc::ByteBuffer* response) {
  auto* reactor = context->DefaultReactor();
  if (absl::Status s = Admit(context); !s.ok()) {
    reactor->Finish(ToGrpcStatus(s));
    return reactor;
  }
  internal::TokenizeRequest req;
  if (!Parse(request, &req)) {
    reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 "request: not a valid kimi.v1.TokenizeRequest"));
    return reactor;
  }
  if (!IsValidUtf8(req.text())) {
    reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "text: not valid UTF-8"));
    return reactor;
  }
  v1::TokenizeResponse out;
  for (int32_t id : backend_->tokenizer->Encode(req.text(), req.add_special_tokens())) {
    out.add_token_ids(static_cast<uint32_t>(id));
  }
  *response = Serialize(out);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* GenerationService::Detokenize(grpc::CallbackServerContext* context,
                                                        const v1::DetokenizeRequest* request,
                                                        v1::DetokenizeResponse* response) {
  auto* reactor = context->DefaultReactor();
  if (absl::Status s = Admit(context); !s.ok()) {
    reactor->Finish(ToGrpcStatus(s));
    return reactor;
  }
  const int64_t vocab = backend_->model->config().vocab;
  tokenizer::StreamingDetokenizer detok(backend_->tokenizer.get(),
                                        {{}, request->skip_special_tokens()});
  std::string text;
  std::vector<int32_t> ids;
  for (int i = 0; i < request->token_ids_size(); ++i) {
    if (request->token_ids(i) >= static_cast<uint32_t>(vocab)) {
      reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                   absl::StrCat("token_ids[", i, "]: ", request->token_ids(i),
                                                " is not a token id (must be < ", vocab, ")")));
      return reactor;
    }
    ids.push_back(static_cast<int32_t>(request->token_ids(i)));
    text += detok.Push(ids.back()).text;
  }
  text += detok.Finish().text;  // incomplete UTF-8 at the end becomes U+FFFD
  response->set_text(text);
  response->set_raw(backend_->tokenizer->Decode(ids));
  if (request->each_token()) {
    for (int32_t id : ids) {
      v1::DetokenizedToken* t = response->add_tokens();
      const int32_t one[1] = {id};
      t->set_raw(backend_->tokenizer->Decode(one));
      t->set_special(backend_->tokenizer->IsSpecial(id));
    }
  }
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* GenerationService::GetModelInfo(grpc::CallbackServerContext* context,
                                                          const v1::GetModelInfoRequest*,
                                                          v1::ModelInfo* info) {
  auto* reactor = context->DefaultReactor();
  if (absl::Status s = Admit(context); !s.ok()) {
    reactor->Finish(ToGrpcStatus(s));
    return reactor;
  }
  const ModelConfig& c = backend_->model->config();
  info->set_model_name(backend_->config.model_name);
  info->set_model_type(c.family == ModelFamily::kKimiK3 ? "kimi_k3" : "kimi_linear");
  for (LayerKind k : c.layer_kinds) info->add_layer_kinds(k == LayerKind::kKda ? "kda" : "mla");
  info->set_context_limit(static_cast<uint32_t>(std::min<int64_t>(c.max_context, UINT32_MAX)));
  info->set_tensor_parallel(static_cast<uint32_t>(backend_->config.tp));
  info->set_expert_parallel(static_cast<uint32_t>(backend_->config.ep));
  info->set_pipeline_parallel(static_cast<uint32_t>(backend_->config.pp));
  info->set_vocab_size(static_cast<uint32_t>(c.vocab));
  info->set_max_tokens_limit(static_cast<uint32_t>(backend_->config.max_tokens));
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace kimi::server
