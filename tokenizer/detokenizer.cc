#include "tokenizer/detokenizer.h"

#include <algorithm>
#include <utility>

#include "tokenizer/utf8.h"

namespace kimi::tokenizer {
namespace {

constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD

}  // namespace

StreamingDetokenizer::StreamingDetokenizer(const Tokenizer* tokenizer, Options options)
    : tokenizer_(tokenizer), options_(std::move(options)) {
  auto& stops = options_.stop_strings;
  stops.erase(std::remove(stops.begin(), stops.end(), std::string()), stops.end());
}

StreamingDetokenizer::Output StreamingDetokenizer::Push(int32_t id) {
  if (stopped_) return {};
  if (options_.skip_special_tokens && tokenizer_->IsSpecial(id)) return {};
  return PushBytes(tokenizer_->TokenText(id));
}

StreamingDetokenizer::Output StreamingDetokenizer::PushBytes(absl::string_view bytes) {
  if (stopped_) return {};
  bytes_.append(bytes.data(), bytes.size());
  std::string text;
  DrainUtf8(/*final=*/false, &text);
  return Release(std::move(text), /*final=*/false);
}

StreamingDetokenizer::Output StreamingDetokenizer::Finish() {
  if (stopped_) return {};
  std::string text;
  DrainUtf8(/*final=*/true, &text);
  return Release(std::move(text), /*final=*/true);
}

void StreamingDetokenizer::DrainUtf8(bool final, std::string* text) {
  size_t i = 0;
  while (i < bytes_.size()) {
    size_t len = 0;
    const Utf8Status st = ScanUtf8(bytes_, i, &len);
    if (st == Utf8Status::kIncomplete) {
      if (!final) break;
      *text += kReplacement;  // a truncated character at the end of the stream
      i = bytes_.size();
      break;
    }
    if (st == Utf8Status::kInvalid) {
      *text += kReplacement;
    } else {
      text->append(bytes_, i, len);
    }
    i += len;
  }
  bytes_.erase(0, i);
}

StreamingDetokenizer::Output StreamingDetokenizer::Release(std::string new_text, bool final) {
  Output out;
  held_ += new_text;
  // The earliest stop string wins; at equal starts the longest.
  size_t best = std::string::npos;
  for (const std::string& stop : options_.stop_strings) {
    const size_t pos = held_.find(stop);
    if (pos != std::string::npos &&
        (pos < best || (pos == best && stop.size() > matched_stop_.size()))) {
      best = pos;
      matched_stop_ = stop;
    }
  }
  if (best != std::string::npos) {
    out.text = held_.substr(0, best);
    out.stopped = stopped_ = true;
    held_.clear();
    bytes_.clear();
    return out;
  }
  size_t keep = 0;  // the longest tail of held_ that begins some stop string
  if (!final) {
    for (const std::string& stop : options_.stop_strings) {
      for (size_t len = std::min(stop.size() - 1, held_.size()); len > keep; --len) {
        if (absl::string_view(held_).substr(held_.size() - len) ==
            absl::string_view(stop).substr(0, len)) {
          keep = len;
          break;
        }
      }
    }
    // Never split a character (possible only with a stop string that is not valid UTF-8).
    while (keep < held_.size() &&
           (static_cast<uint8_t>(held_[held_.size() - keep]) & 0xC0) == 0x80) {
      ++keep;
    }
  }
  out.text = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

}  // namespace kimi::tokenizer
