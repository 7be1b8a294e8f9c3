// Streaming detokenizer: token ids in, text out, one token at a time.
//   - Emits only complete UTF-8: a token that ends inside a character keeps those bytes until the
//     character completes; bytes that can never form a character become U+FFFD (one per maximal
//     invalid subpart, as Python's errors="replace").
//   - Stop strings may span tokens: text that could still be the start of a stop string is held
//     back; once one matches, the text before it is emitted and nothing after it ever is (the stop
//     string itself is not emitted, as OpenAI's API does).
// Not thread-safe: one per request.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "tokenizer/tokenizer.h"

namespace kimi::tokenizer {

class StreamingDetokenizer {
 public:
  struct Options {
    std::vector<std::string> stop_strings;  // empty strings are ignored
    bool skip_special_tokens = true;        // ids past the base ranks decode to nothing
  };
  struct Output {
    std::string text;      // newly complete text (may be empty)
    bool stopped = false;  // a stop string matched: this is the last text of the stream
  };

  // `tokenizer` must outlive this object.
  StreamingDetokenizer(const Tokenizer* tokenizer, Options options);

  Output Push(int32_t id);
  // Raw bytes, as if a token with these bytes had been pushed.
  Output PushBytes(absl::string_view bytes);
  // End of the stream: a trailing partial character becomes U+FFFD, held-back text is released.
  Output Finish();

  bool stopped() const { return stopped_; }
  // The stop string that matched (empty if none).
  const std::string& matched_stop() const { return matched_stop_; }

 private:
  // Moves complete characters (and U+FFFD for invalid bytes) from bytes_ into *text; with
  // `final`, an incomplete tail is replaced too.
  void DrainUtf8(bool final, std::string* text);
  Output Release(std::string new_text, bool final);

  const Tokenizer* tokenizer_;
  Options options_;
  std::string bytes_;  // undecoded bytes: at most one incomplete character
  std::string held_;   // decoded text that may begin a stop string
  bool stopped_ = false;
  std::string matched_stop_;
};

}  // namespace kimi::tokenizer
