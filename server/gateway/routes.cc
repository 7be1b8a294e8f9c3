#include "server/gateway/routes.h"

#include <chrono>
#include <exception>
#include <functional>
#include <string>

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "server/gateway/completion_handler.h"
#include "server/gateway/errors.h"
#include "server/gateway/http_reply.h"

namespace kimi::gateway {
namespace {

using json = nlohmann::json;
using Handler = std::function<void(const httplib::Request&, httplib::Response&)>;

const int64_t kStarted = std::chrono::duration_cast<std::chrono::seconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();

// Runs `body`; whatever it throws becomes a 500 in OpenAI's shape.
void Guarded(const httplib::Request& req, httplib::Response& res,
             const std::function<void()>& body) {
  try {
    body();
  } catch (const std::exception& e) {
    spdlog::error("{} {}: {}", req.method, req.path, e.what());
    SendError(res, absl::InternalError(absl::StrCat("internal error: ", e.what())));
  } catch (...) {
    spdlog::error("{} {}: unknown exception", req.method, req.path);
    SendError(res, absl::InternalError("internal error"));
  }
}

Handler Guard(Handler handler) {
  return [handler = std::move(handler)](const httplib::Request& req, httplib::Response& res) {
    Guarded(req, res, [&] { handler(req, res); });
  };
}

// The authorization to send to the backend for this request, or 401.
absl::StatusOr<std::string> Authorize(const Gateway& g, const httplib::Request& req) {
  const std::string header = req.get_header_value("Authorization");
  if (!g.keys.enabled()) {  // passthrough: the backend decides, if gRPC can carry the value
    if (absl::Status s = CheckMetadataValue(header); !s.ok()) {
      return InvalidApiKey(absl::StrCat("The Authorization header ", s.message(), "."));
    }
    return header;
  }
  if (header.empty()) {
    return InvalidApiKey(
        "You didn't provide an API key. Send it in the header "
        "'Authorization: Bearer YOUR_KEY'.");
  }
  if (!g.keys.Check(header).ok()) return InvalidApiKey("Incorrect API key provided.");
  return g.backend_authorization;
}

}  // namespace

absl::Status CheckMetadataValue(std::string_view value) {
  if (value.size() > kMaxAuthorizationBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("is longer than ", kMaxAuthorizationBytes, " bytes"));
  }
  for (char c : value) {
    if (c < 0x20 || c > 0x7e) {
      return absl::InvalidArgumentError("holds a character other than printable ASCII");
    }
  }
  return absl::OkStatus();
}

namespace {

json ModelJson(const v1::ModelInfo& info) {
  return {{"id", info.model_name()},
          {"object", "model"},
          {"created", kStarted},
          {"owned_by", "kimi-serve"},
          {"model_type", info.model_type()},
          {"context_length", info.context_limit()}};
}

void Health(Gateway& g, httplib::Response& res) {
  if (g.draining.load()) return SendError(res, absl::UnavailableError("the gateway is draining"));
  auto serving = g.backend->Serving();
  if (serving.ok() && *serving) return SendJson(res, 200, {{"status", "ok"}});
  SendError(res, absl::UnavailableError(
                     serving.ok() ? "the backend is not serving yet (loading or draining)"
                                  : absl::StrCat("the backend is unreachable: ",
                                                 std::string(serving.status().message()))));
}

void Models(Gateway& g, const httplib::Request& req, httplib::Response& res) {
  auto auth = Authorize(g, req);
  if (!auth.ok()) return SendError(res, auth.status());
  auto info = g.model->Get(*auth);
  if (!info.ok()) return SendError(res, info.status());
  if (req.matches.size() > 1) {  // /v1/models/{model}
    const std::string wanted = req.matches[1].str();
    if (wanted != info->model_name()) return SendError(res, ModelNotFound(wanted));
    return SendJson(res, 200, ModelJson(*info));
  }
  SendJson(res, 200, {{"object", "list"}, {"data", json::array({ModelJson(*info)})}});
}

// A request body as JSON whatever its Content-Type, decompressed (httplib inflates gzip and
// deflate as it reads), up to kMaxBodyBytes. Read here rather than by httplib, which checks only
// the bytes on the wire (40 KB of gzip inflated to 40 MiB and was accepted) and parses a
// form-encoded body as a form, refusing one over 8 KiB (curl -d sends that Content-Type).
absl::StatusOr<std::string> ReadBody(const httplib::Request& req, const httplib::Response& res,
                                     const httplib::ContentReader& reader) {
  // httplib inflates only these names, spelled so: another (GZIP, "gzip, gzip", compress) reached
  // the JSON parser still compressed and was called invalid JSON.
  const std::string coding = req.get_header_value("Content-Encoding");
  if (!coding.empty() && coding != "gzip" && coding != "deflate" && coding != "br" &&
      coding != "identity") {
    return WithDetails(absl::InvalidArgumentError(absl::StrCat(
                           "Content-Encoding \"", coding,
                           "\" is not supported: send gzip, deflate, br or identity (lower case)")),
                       "", "unsupported_content_encoding");
  }
  if (req.is_multipart_form_data()) {  // httplib would call a multipart receiver this never gives
    return WithDetails(
        absl::InvalidArgumentError(
            "multipart/form-data bodies are not supported: send the request as JSON"),
        "", "invalid_request");
  }
  std::string body;
  bool too_large = false;
  const bool read = reader([&](const char* data, size_t n) {
    if (n > kMaxBodyBytes - body.size()) {
      too_large = true;
      return false;
    }
    body.append(data, n);
    return true;
  });
  // httplib refuses a Content-Length over kMaxBodyBytes itself, without handing over a byte (it
  // reads and drops the announced body, setting 413 on the response): the same answer as a body
  // found too large while reading.
  if (too_large || (!read && res.status == 413)) {
    return RequestTooLarge(absl::StrCat("The request body is larger than the gateway accepts (",
                                        kMaxBodyBytes >> 20, " MiB) once decompressed."));
  }
  if (!read) return absl::InvalidArgumentError("The request body could not be read.");
  return body;
}

httplib::Server::HandlerWithContentReader Completion(Gateway& g, Endpoint endpoint) {
  return [&g, endpoint](const httplib::Request& req, httplib::Response& res,
                        const httplib::ContentReader& reader) {
    Guarded(req, res, [&] {
      auto body = ReadBody(req, res, reader);
      if (!body.ok()) {
        SendError(res, body.status());
        res.set_header("Connection", "close");  // the rest of the body was not read
        return;
      }
      auto auth = Authorize(g, req);
      if (!auth.ok()) return SendError(res, auth.status());
      HandleCompletion(g, endpoint, *auth, *body, req, res);
    });
  };
}

// Responses httplib makes itself (unknown route, body too large): the same JSON shape.
httplib::Server::HandlerResponse OnHttpError(const httplib::Request& req, httplib::Response& res) {
  if (!res.body.empty() || res.is_chunked_content_provider_) {
    return httplib::Server::HandlerResponse::Unhandled;  // a handler answered already
  }
  if (res.status == 499) return httplib::Server::HandlerResponse::Unhandled;
  const std::string what = res.status == 404
                               ? absl::StrCat("Unknown request URL: ", req.method, " ", req.path)
                               : absl::StrCat("HTTP ", res.status, ": ", req.method, " ", req.path);
  absl::Status s =
      res.status == 404 ? WithDetails(absl::NotFoundError(what), "", "unknown_url")
      : res.status == 413
          ? RequestTooLarge(absl::StrCat("The request body is larger than the gateway accepts (",
                                         kMaxBodyBytes >> 20, " MiB)."))
          : absl::InvalidArgumentError(what);
  const int status = res.status;
  SendError(res, s);
  res.status = status;
  return httplib::Server::HandlerResponse::Handled;
}

}  // namespace

void AddRoutes(httplib::Server& server, Gateway& g) {
  server.Get("/health",
             Guard([&g](const httplib::Request&, httplib::Response& res) { Health(g, res); }));
  server.Get("/v1/models", Guard([&g](const httplib::Request& req, httplib::Response& res) {
               Models(g, req, res);
             }));
  server.Get(R"(/v1/models/(.+))", Guard([&g](const httplib::Request& req, httplib::Response& res) {
               Models(g, req, res);
             }));
  server.Post("/v1/chat/completions", Completion(g, Endpoint::kChat));
  server.Post("/v1/completions", Completion(g, Endpoint::kCompletions));
  server.set_error_handler(httplib::Server::HandlerWithResponse(OnHttpError));
  server.set_exception_handler(
      [](const httplib::Request& req, httplib::Response& res, std::exception_ptr) {
        SendError(res, absl::InternalError(absl::StrCat("internal error in ", req.path)));
      });
}

}  // namespace kimi::gateway
