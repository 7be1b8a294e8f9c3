#include "server/gateway/http_reply.h"

#include "server/gateway/errors.h"
#include "server/gateway/openai_response.h"

namespace kimi::gateway {

void SendJson(httplib::Response& res, int status, const nlohmann::json& body) {
  res.status = status;
  res.set_content(Dump(body), "application/json");
}

void SendError(httplib::Response& res, const absl::Status& status) {
  const HttpError e = ToHttpError(status);
  if (e.status == 429 || e.status == 503) res.set_header("Retry-After", "1");
  SendJson(res, e.status, e.body);
}

}  // namespace kimi::gateway
