// POST /v1/chat/completions and POST /v1/completions.
//
//   body --ParseOpenAIRequest--> choices --ServedModel::Check--> one Generate stream per choice
//   non-streaming: wait for every stream, answer one JSON object (or the first failure's error);
//   streaming: wait until every stream has said something (so a rejection such as a full queue is
//   still an HTTP error: 400/401/429/503), then answer 200 with server-sent events from httplib's
//   chunked content provider, which drains the streams' events on this connection's thread.
//
// A client that goes away cancels every stream of its request: while waiting (ClientWatch), when a
// write fails or DataSink::is_writable() turns false (polled whenever no event arrives for 100 ms),
// and in any case when httplib releases the response.
#pragma once

#include <string>

#include "server/gateway/gateway.h"
#include "server/gateway/openai_request.h"
#include <httplib.h>

namespace kimi::gateway {

// `authorization`: the metadata value to send to the backend (empty: none).
void HandleCompletion(Gateway& gateway, Endpoint endpoint, const std::string& authorization,
                      const std::string& body, const httplib::Request& req, httplib::Response& res);

}  // namespace kimi::gateway
