#include "tokenizer/special_tokens.h"

#include <algorithm>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace kimi::tokenizer {

absl::StatusOr<SpecialTokens> SpecialTokens::FromTokenizerConfig(absl::string_view json,
                                                                 int32_t num_base) {
  const nlohmann::json cfg = nlohmann::json::parse(json.begin(), json.end(), nullptr,
                                                   /*allow_exceptions=*/false);
  if (cfg.is_discarded() || !cfg.is_object()) {
    return absl::InvalidArgumentError("tokenizer_config.json is not a JSON object");
  }
  std::vector<SpecialToken> tokens;
  std::set<int32_t> listed;
  if (auto it = cfg.find("added_tokens_decoder"); it != cfg.end()) {
    if (!it->is_object()) {
      return absl::InvalidArgumentError(
          "tokenizer_config.json: added_tokens_decoder is not an object");
    }
    for (const auto& [key, entry] : it->items()) {
      int32_t id = -1;
      if (!absl::SimpleAtoi(key, &id) || id < 0 || !entry.is_object() ||
          !entry.contains("content") || !entry["content"].is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat("tokenizer_config.json: added_tokens_decoder entry \"", key,
                         "\" is not {\"content\": string, ...} under a non-negative id"));
      }
      if (id >= (1 << 30)) {  // the vocabulary's size is one past the largest id, an int32
        return absl::InvalidArgumentError(absl::StrCat("tokenizer_config.json: added token id ", id,
                                                       " is larger than any vocabulary"));
      }
      if (id < num_base) {
        return absl::InvalidArgumentError(absl::StrCat("tokenizer_config.json: added token ", id,
                                                       " (", entry["content"].get<std::string>(),
                                                       ") overlaps the ", num_base, " base ranks"));
      }
      SpecialToken t;
      t.id = id;
      t.text = entry["content"].get<std::string>();
      const auto special = entry.find("special");
      t.special = special == entry.end() || !special->is_boolean() || special->get<bool>();
      listed.insert(id);
      tokens.push_back(std::move(t));
    }
  }
  for (int32_t id = num_base; id < num_base + kNumReserved; ++id) {
    if (!listed.count(id))
      tokens.push_back({absl::StrCat("<|reserved_token_", id, "|>"), id, true});
  }
  auto out = FromList(std::move(tokens));
  if (!out.ok()) return out.status();
  if (auto it = cfg.find("eos_token"); it != cfg.end()) {
    if (it->is_string()) {
      out->eos_token_ = it->get<std::string>();
    } else if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
      out->eos_token_ = (*it)["content"].get<std::string>();
    }
  }
  return out;
}

absl::StatusOr<SpecialTokens> SpecialTokens::FromList(std::vector<SpecialToken> tokens) {
  SpecialTokens s;
  std::sort(tokens.begin(), tokens.end(),
            [](const SpecialToken& a, const SpecialToken& b) { return a.id < b.id; });
  s.tokens_ = std::move(tokens);
  if (absl::Status st = s.Index(); !st.ok()) return st;
  return s;
}

absl::Status SpecialTokens::Index() {
  std::set<size_t> lengths;
  for (size_t k = 0; k < tokens_.size(); ++k) {
    const SpecialToken& t = tokens_[k];
    if (t.text.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("special token ", t.id, " has no text"));
    }
    if (!id_of_.emplace(t.text, t.id).second || !index_of_id_.emplace(t.id, k).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("special token ", t.id, " (", t.text, ") repeats a text or an id"));
    }
    lengths.insert(t.text.size());
    first_byte_[static_cast<uint8_t>(t.text[0])] = true;
  }
  lengths_.assign(lengths.rbegin(), lengths.rend());
  return absl::OkStatus();
}

std::optional<int32_t> SpecialTokens::Id(absl::string_view text) const {
  auto it = id_of_.find(text);
  if (it == id_of_.end()) return std::nullopt;
  return it->second;
}

const SpecialToken* SpecialTokens::Find(int32_t id) const {
  auto it = index_of_id_.find(id);
  return it == index_of_id_.end() ? nullptr : &tokens_[it->second];
}

bool SpecialTokens::FindNext(absl::string_view text, size_t from, size_t* begin, size_t* end,
                             int32_t* id) const {
  if (tokens_.empty()) return false;
  for (size_t i = from; i < text.size(); ++i) {
    if (!first_byte_[static_cast<uint8_t>(text[i])]) continue;
    for (size_t len : lengths_) {
      if (len > text.size() - i) continue;
      auto it = id_of_.find(text.substr(i, len));
      if (it != id_of_.end()) {
        *begin = i;
        *end = i + len;
        *id = it->second;
        return true;
      }
    }
  }
  return false;
}

}  // namespace kimi::tokenizer
