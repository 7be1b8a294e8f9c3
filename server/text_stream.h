// The scheduler's TextStream over the tokenizer's streaming detokenizer.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "scheduler/engine_loop.h"
#include "tokenizer/detokenizer.h"

namespace kimi::server {

class DetokenizerStream : public sched::TextStream {
 public:
  DetokenizerStream(const tokenizer::Tokenizer* tok, const std::vector<std::string>& stops)
      : detok_(tok, {stops, /*skip_special_tokens=*/true}) {}
  std::string Push(int32_t token, bool* stopped) override {
    auto out = detok_.Push(token);
    *stopped = out.stopped;
    return std::move(out.text);
  }
  std::string Finish() override { return detok_.Finish().text; }

 private:
  tokenizer::StreamingDetokenizer detok_;
};

inline sched::TextStreamFactory DetokenizerFactory(const tokenizer::Tokenizer* tok) {
  return [tok](const std::vector<std::string>& stops) -> std::unique_ptr<sched::TextStream> {
    return std::make_unique<DetokenizerStream>(tok, stops);
  };
}

}  // namespace kimi::server
