#include "server/gateway/completion_handler.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <exception>
#include <memory>
#include <random>
#include <vector>

#include <spdlog/spdlog.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "server/gateway/client_watch.h"
#include "server/gateway/errors.h"
#include "server/gateway/http_reply.h"
#include "server/gateway/openai_response.h"

namespace kimi::gateway {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// How long the HTTP thread waits for an event before it checks on the client.
constexpr auto kPoll = std::chrono::milliseconds(100);
constexpr size_t kMaxRequestIdBytes = 256;  // the server's limit

std::string NewId(Endpoint endpoint) {
  static constexpr char kAlphabet[] =
      "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string id = endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-";
  for (int i = 0; i < 24; ++i) id += kAlphabet[rng() % 62];
  return id;
}

// Cuts `s` to at most `n` bytes without splitting a UTF-8 sequence.
std::string Truncate(std::string s, size_t n) {
  if (s.size() <= n) return s;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xc0) == 0x80) --n;
  s.resize(n);
  return s;
}

int64_t UnixNow() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// One choice's progress.
struct Choice {
  bool heard = false;  // a message arrived
  bool ended = false;
  ChoiceResult result;
  TextOffsets offsets;  // completions logprobs, streaming
};

// The Generate streams behind one HTTP request. Lives on the connection's thread (the handler, then
// httplib's content provider and releaser); only the EventQueue is shared with gRPC's threads.
class Session {
 public:
  Session(Gateway& g, OpenAIRequest request, std::string authorization)
      : g_(g),
        request_(std::move(request)),
        authorization_(std::move(authorization)),
        events_(std::make_shared<EventQueue>()),
        choices_(request_.choices.size()),
        start_(Clock::now()) {
    ++g_.open_requests;
    meta_.endpoint = request_.endpoint;
    meta_.id = NewId(request_.endpoint);
    meta_.created = UnixNow();
    meta_.model = request_.model;
    meta_.top_logprobs = request_.top_logprobs;
    meta_.include_usage = request_.include_usage;
  }
  ~Session() {
    CancelAll();
    --g_.open_requests;
  }

  bool stream() const { return request_.stream; }
  const absl::Status& error() const { return error_; }

  void Start();
  void CancelAll();
  // Waits until every choice has sent a message or ended (`whole`: until all ended), or one
  // failed, or the gateway is stopping (error() says so). False if the client went away (the
  // streams are cancelled).
  bool Await(const ClientWatch& watch, bool whole);
  json Body() const;
  // Fetches the token pieces `tokens` (and their shown alternatives) need, in one call.
  void Prefetch(const google::protobuf::RepeatedPtrField<v1::TokenLogprob>& tokens) const;
  // httplib's chunked content provider: writes what arrived, polls the client when nothing did.
  bool Pump(httplib::DataSink& sink);
  void Log(int http_status, const std::string& note);

 private:
  std::optional<StreamEvent> Next();
  void Render(const StreamEvent& e, std::string* out);
  std::string RequestId(size_t choice) const;
  TokenPiece PieceOf(uint32_t id) const {
    return g_.token_bytes->Get(meta_.model, id, authorization_);
  }
  bool AllEnded() const { return ended_ == choices_.size(); }
  // A request still open when the gateway's drain time is up ends with an error the client can act
  // on (a 503, or an error event on a stream that began), not a cut connection.
  void EndForStop() {
    cancelled_ = "gateway stopping";
    error_ = absl::UnavailableError(
        "the gateway shut down before the request finished; retry on another replica");
  }
  std::vector<ChoiceResult> Results() const;

  Gateway& g_;
  const OpenAIRequest request_;
  const std::string authorization_;
  ResponseMeta meta_;
  std::shared_ptr<EventQueue> events_;
  std::vector<std::shared_ptr<GenerateCall>> calls_;
  std::vector<Choice> choices_;
  size_t ended_ = 0;
  absl::Status error_;              // the first failure
  std::deque<StreamEvent> replay_;  // events seen before the stream began
  bool began_ = false, finished_ = false, logged_ = false;
  std::string cancelled_;  // why the gateway cancelled, if it did
  Clock::time_point start_;
};

std::string Session::RequestId(size_t choice) const {
  std::string id = meta_.id;
  if (choices_.size() > 1) absl::StrAppend(&id, "/", choice);
  if (!request_.user.empty()) absl::StrAppend(&id, " user=", request_.user);
  return Truncate(std::move(id), kMaxRequestIdBytes);
}

void Session::Start() {
  for (size_t i = 0; i < request_.choices.size(); ++i) {
    v1::GenerateRequest r = request_.choices[i].request;
    r.set_request_id(RequestId(i));
    calls_.push_back(g_.backend->Generate(r, authorization_, static_cast<int>(i), events_));
  }
}

void Session::CancelAll() {
  if (AllEnded()) return;
  for (size_t i = 0; i < calls_.size(); ++i) {
    if (!choices_[i].ended) calls_[i]->Cancel();
  }
}

std::optional<StreamEvent> Session::Next() {
  std::optional<StreamEvent> e = events_->Pop(kPoll);
  if (!e) return e;
  Choice& c = choices_[e->choice];
  if (!e->end) {
    c.heard = true;
    c.result.Add(e->message, /*keep_text=*/!request_.stream);
    return e;
  }
  c.ended = true;
  ++ended_;
  absl::Status s = FromGrpc(e->status, request_.choices[e->choice].names);
  const v1::FinishReason f = c.result.finish;
  if (s.ok() && f != v1::FINISH_REASON_STOP && f != v1::FINISH_REASON_LENGTH) {
    s = absl::InternalError("the backend ended a stream without a finish reason");
  }
  if (!s.ok() && error_.ok()) error_ = s;
  return e;
}

bool Session::Await(const ClientWatch& watch, bool whole) {
  auto done = [&] {
    if (!error_.ok() || AllEnded()) return true;
    if (whole) return false;
    for (const Choice& c : choices_) {
      if (!c.heard && !c.ended) return false;
    }
    return true;
  };
  while (!done()) {
    if (watch.Gone()) {
      cancelled_ = "client went away";
      CancelAll();
      return false;
    }
    if (g_.stopping.load()) {
      EndForStop();
      break;
    }
    std::optional<StreamEvent> e = Next();
    if (e && !whole) replay_.push_back(std::move(*e));
  }
  if (!error_.ok()) CancelAll();
  return true;
}

std::vector<ChoiceResult> Session::Results() const {
  std::vector<ChoiceResult> out;
  for (const Choice& c : choices_) out.push_back(c.result);
  return out;
}

void Session::Prefetch(const google::protobuf::RepeatedPtrField<v1::TokenLogprob>& tokens) const {
  if (meta_.top_logprobs < 0 || tokens.empty()) return;
  std::vector<uint32_t> ids;
  for (const v1::TokenLogprob& t : tokens) {
    ids.push_back(t.token_id());
    for (int k = 0; k < t.top_size() && k < meta_.top_logprobs; ++k) {
      ids.push_back(t.top(k).token_id());
    }
  }
  g_.token_bytes->Prefetch(meta_.model, ids, authorization_);
}

json Session::Body() const {
  const std::vector<ChoiceResult> results = Results();
  for (const ChoiceResult& r : results) {
    google::protobuf::RepeatedPtrField<v1::TokenLogprob> tokens(r.logprobs.begin(),
                                                                r.logprobs.end());
    Prefetch(tokens);
  }
  return CompletionJson(meta_, results, request_.n, [this](uint32_t id) { return PieceOf(id); });
}

void Session::Render(const StreamEvent& e, std::string* out) {
  if (e.end) return;  // a good end was announced by its last message's finish reason
  Choice& c = choices_[e.choice];
  Prefetch(e.message.logprobs());
  auto piece_of = [this](uint32_t id) { return PieceOf(id); };
  if (auto chunk = DeltaChunk(meta_, e.choice, e.message, piece_of, &c.offsets)) {
    *out += SseData(*chunk);
  }
  const v1::FinishReason f = e.message.finish_reason();
  if (f == v1::FINISH_REASON_STOP || f == v1::FINISH_REASON_LENGTH) {
    *out += SseData(FinishChunk(meta_, e.choice, f));
  }
}

bool Session::Pump(httplib::DataSink& sink) {
  std::string out;
  if (!began_) {
    began_ = true;
    if (meta_.endpoint == Endpoint::kChat) {
      for (size_t i = 0; i < choices_.size(); ++i) {
        out += SseData(RoleChunk(meta_, static_cast<int>(i)));
      }
    }
  }
  std::optional<StreamEvent> e;
  if (!replay_.empty()) {
    e = std::move(replay_.front());
    replay_.pop_front();
  } else {
    e = Next();
  }
  if (e) Render(*e, &out);
  if (error_.ok() && !AllEnded() && g_.stopping.load()) EndForStop();
  if (!error_.ok()) {  // a stream failed after the response began: an error event ends it
    CancelAll();
    out += SseData(ToHttpError(error_).body);
    finished_ = true;
  } else if (AllEnded() && replay_.empty()) {
    if (meta_.include_usage) out += SseData(UsageChunk(meta_, TotalUsage(Results(), request_.n)));
    out += kSseDone;
    finished_ = true;
  }
  if (!out.empty() && !sink.write(out.data(), out.size())) {
    cancelled_ = "client went away";
    CancelAll();
    return false;
  }
  if (finished_) {
    sink.done();
    return true;
  }
  if (!e && !sink.is_writable()) {
    cancelled_ = "client went away";
    CancelAll();
    return false;
  }
  return true;
}

void Session::Log(int http_status, const std::string& note) {
  if (logged_) return;
  logged_ = true;
  const std::vector<ChoiceResult> results = Results();
  const json usage = TotalUsage(results, request_.n);
  // A stream cut short (client gone, gateway stopping) has no final usage: count what arrived.
  uint32_t completion = 0;
  for (const ChoiceResult& r : results) {
    completion += std::max(r.usage.completion_tokens(), r.tokens_seen);
  }
  std::string outcome = note;
  if (outcome.empty()) outcome = cancelled_;
  if (outcome.empty() && !error_.ok()) outcome = std::string(error_.message());
  // httplib stopped calling Pump (the gateway stopping while a write waited on a slow client).
  if (outcome.empty() && began_ && !finished_) outcome = "the stream was cut before its end";
  spdlog::info(
      "{} {} model={} n={} stream={} status={} prompt_tokens={} completion_tokens={} "
      "duration={:.3f}s user=\"{}\" {}",
      meta_.endpoint == Endpoint::kChat ? "chat" : "completions", meta_.id, meta_.model, request_.n,
      request_.stream, http_status, usage["prompt_tokens"].get<uint32_t>(), completion,
      std::chrono::duration<double>(Clock::now() - start_).count(),
      absl::Utf8SafeCEscape(request_.user), outcome);  // escaped: one line, none forged
}

}  // namespace

void HandleCompletion(Gateway& g, Endpoint endpoint, const std::string& authorization,
                      const std::string& body, const httplib::Request& req,
                      httplib::Response& res) {
  if (g.draining.load()) {
    return SendError(res, absl::UnavailableError("the gateway is shutting down"));
  }
  auto parsed = ParseOpenAIRequest(endpoint, body, g.request_options);
  if (!parsed.ok()) return SendError(res, parsed.status());
  auto info = g.model->Check(parsed->model, authorization);
  if (!info.ok()) return SendError(res, info.status());
  // A limit the client never set stays within the server's: the default applies up to it (a
  // server with limits.max_tokens under --default-max-tokens refused such requests, naming a
  // max_tokens the client had not sent).
  if (parsed->default_max_tokens && info->max_tokens_limit() > 0) {
    for (ChoiceRequest& c : parsed->choices) {
      c.request.set_max_tokens(std::min(c.request.max_tokens(), info->max_tokens_limit()));
    }
  }
  auto session = std::make_shared<Session>(g, std::move(*parsed), authorization);
  session->Start();
  const ClientWatch watch(req);
  if (!session->Await(watch, /*whole=*/!session->stream())) {
    session->Log(499, "");
    res.status = 499;  // nobody reads it: the client is gone
    return;
  }
  if (!session->error().ok()) {
    SendError(res, session->error());
    session->Log(res.status, "");
    return;
  }
  if (!session->stream()) {
    SendJson(res, 200, session->Body());
    session->Log(200, "");
    return;
  }
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  // httplib calls these outside its handler's try/catch: nothing may escape them.
  res.set_chunked_content_provider(
      "text/event-stream",  // exactly this type: httplib never compresses it
      [session](size_t, httplib::DataSink& sink) {
        try {
          return session->Pump(sink);
        } catch (const std::exception& e) {
          spdlog::error("stream: {}", e.what());
          session->CancelAll();
          return false;
        }
      },
      [session](bool) {
        try {
          session->CancelAll();
          session->Log(200, "");
        } catch (const std::exception& e) {
          spdlog::error("stream end: {}", e.what());
        }
      });
}

}  // namespace kimi::gateway
