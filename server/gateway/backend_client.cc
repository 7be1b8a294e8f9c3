#include "server/gateway/backend_client.h"

#include "absl/strings/str_cat.h"

namespace kimi::gateway {
namespace {

constexpr auto kUnaryDeadline = std::chrono::seconds(10);
constexpr auto kHealthDeadline = std::chrono::seconds(1);

absl::Status ToAbsl(const grpc::Status& s) {
  if (s.ok()) return absl::OkStatus();
  // absl and gRPC share the canonical code numbering (google.rpc.Code).
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

void Prepare(grpc::ClientContext* ctx, const std::string& authorization,
             std::chrono::seconds deadline) {
  if (!authorization.empty()) ctx->AddMetadata("authorization", authorization);
  ctx->set_deadline(std::chrono::system_clock::now() + deadline);
}

// A Generate stream on the callback API. Reads continuously (messages queue up in the gateway when
// the HTTP client is slower than generation, so the shared channel never stalls). It holds a
// reference to itself from Start() until OnDone, the last callback gRPC makes.
class CallbackCall final : public GenerateCall,
                           public grpc::ClientReadReactor<v1::GenerateResponse>,
                           public std::enable_shared_from_this<CallbackCall> {
 public:
  CallbackCall(BackendClient* owner, int choice, std::shared_ptr<EventQueue> events)
      : owner_(owner), choice_(choice), events_(std::move(events)) {}

  void Start(v1::Generation::Stub* stub, const v1::GenerateRequest& request,
             const std::string& authorization) {
    request_ = request;
    if (!authorization.empty()) ctx_.AddMetadata("authorization", authorization);
    self_ = shared_from_this();
    owner_->StreamStarted();
    stub->async()->Generate(&ctx_, &request_, this);
    StartRead(&response_);
    StartCall();
  }

  void Cancel() override { ctx_.TryCancel(); }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream ended; OnDone follows with its status
    StreamEvent e;
    e.choice = choice_;
    e.message = std::move(response_);
    events_->Push(std::move(e));
    response_.Clear();
    StartRead(&response_);
  }

  void OnDone(const grpc::Status& status) override {
    StreamEvent e;
    e.choice = choice_;
    e.end = true;
    e.status = status;
    events_->Push(std::move(e));
    BackendClient* owner = owner_;
    std::shared_ptr<CallbackCall> last = std::move(self_);  // may destroy *this on return
    owner->StreamEnded();
  }

 private:
  BackendClient* owner_;
  int choice_;
  std::shared_ptr<EventQueue> events_;
  grpc::ClientContext ctx_;
  v1::GenerateRequest request_;
  v1::GenerateResponse response_;
  std::shared_ptr<CallbackCall> self_;
};

}  // namespace

void EventQueue::Push(StreamEvent e) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::move(e));
  }
  cv_.notify_one();
}

std::optional<StreamEvent> EventQueue::Pop(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return std::nullopt;
  StreamEvent e = std::move(events_.front());
  events_.pop_front();
  return e;
}

BackendClient::BackendClient(const std::string& target,
                             std::shared_ptr<grpc::ChannelCredentials> credentials) {
  grpc::ChannelArguments args;
  // Reconnect quickly once a (re)started backend listens again (gRPC's default backoff reaches
  // two minutes); calls fail fast with UNAVAILABLE while it is down.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  channel_ = grpc::CreateCustomChannel(target, credentials, args);
  stub_ = v1::Generation::NewStub(channel_);
  health_ = grpc::health::v1::Health::NewStub(channel_);
}

BackendClient::~BackendClient() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_.wait_for(lock, std::chrono::seconds(5), [&] { return streams_ == 0; });
}

void BackendClient::StreamStarted() {
  std::lock_guard<std::mutex> lock(mu_);
  ++streams_;
}

void BackendClient::StreamEnded() {
  std::lock_guard<std::mutex> lock(mu_);
  if (--streams_ == 0) idle_.notify_all();
}

std::shared_ptr<GenerateCall> BackendClient::Generate(const v1::GenerateRequest& request,
                                                      const std::string& authorization, int choice,
                                                      std::shared_ptr<EventQueue> events) {
  auto call = std::make_shared<CallbackCall>(this, choice, std::move(events));
  call->Start(stub_.get(), request, authorization);
  return call;
}

absl::StatusOr<v1::ModelInfo> BackendClient::GetModelInfo(const std::string& authorization) {
  grpc::ClientContext ctx;
  Prepare(&ctx, authorization, kUnaryDeadline);
  v1::ModelInfo info;
  if (absl::Status s = ToAbsl(stub_->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info));
      !s.ok()) {
    return s;
  }
  return info;
}

absl::StatusOr<v1::DetokenizeResponse> BackendClient::Detokenize(
    const v1::DetokenizeRequest& request, const std::string& authorization) {
  grpc::ClientContext ctx;
  Prepare(&ctx, authorization, kUnaryDeadline);
  v1::DetokenizeResponse response;
  if (absl::Status s = ToAbsl(stub_->Detokenize(&ctx, request, &response)); !s.ok()) return s;
  return response;
}

absl::StatusOr<bool> BackendClient::Serving() {
  grpc::ClientContext ctx;
  Prepare(&ctx, "", kHealthDeadline);
  grpc::health::v1::HealthCheckRequest request;
  grpc::health::v1::HealthCheckResponse response;
  if (absl::Status s = ToAbsl(health_->Check(&ctx, request, &response)); !s.ok()) return s;
  return response.status() == grpc::health::v1::HealthCheckResponse::SERVING;
}

}  // namespace kimi::gateway
