#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <cctype>
#include <climits>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "tokenizer/chat_format.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tiktoken_bpe.h"
#include "tokenizer/utf8.h"

namespace kimi::tokenizer {
namespace {

// tokenization_kimi.py cuts text into 400,000-char windows and cuts runs of more than 25,000
// consecutive (Python-)whitespace or non-whitespace chars before encoding each part.
constexpr size_t kKimiWindowChars = 400000;
constexpr size_t kKimiMaxRunChars = 25000;

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read ", path));
  return ss.str();
}

// eos_token_id of config.json (top level or text_config) or generation_config.json: int or list.
void CollectEosIds(const nlohmann::json& j, std::vector<int32_t>* ids) {
  if (!j.is_object()) return;
  // Read as int64 and clamped, so that a value past int32 is refused by the range check of the
  // caller rather than wrapped into some other id.
  auto id_of = [](const nlohmann::json& v) {
    return static_cast<int32_t>(std::clamp<int64_t>(v.get<int64_t>(), -1, INT32_MAX));
  };
  auto add = [&](const nlohmann::json& v) {
    if (v.is_number_integer()) ids->push_back(id_of(v));
    if (v.is_array()) {
      for (const auto& x : v) {
        if (x.is_number_integer()) ids->push_back(id_of(x));
      }
    }
  };
  if (auto it = j.find("eos_token_id"); it != j.end()) add(*it);
  if (auto it = j.find("text_config"); it != j.end() && it->is_object()) {
    if (auto e = it->find("eos_token_id"); e != it->end()) add(*e);
  }
}

}  // namespace

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromParts(
    absl::string_view ranks_text, absl::string_view pattern, std::vector<SpecialToken> specials) {
  auto translated = TranslatePattern(pattern);
  if (!translated.ok()) return translated.status();
  return FromPartsPcre2(ranks_text, *translated, std::move(specials));
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromPartsPcre2(
    absl::string_view ranks_text, absl::string_view pcre2_pattern,
    std::vector<SpecialToken> specials) {
  auto t = std::unique_ptr<Tokenizer>(new Tokenizer());
  auto ranks = BpeRanks::Parse(ranks_text);
  if (!ranks.ok()) return ranks.status();
  t->ranks_ = std::make_unique<BpeRanks>(*std::move(ranks));
  auto pre = Pretokenizer::Create(pcre2_pattern);
  if (!pre.ok()) return pre.status();
  t->pretokenizer_ = *std::move(pre);
  for (const SpecialToken& s : specials) {
    if (s.id < t->ranks_->end_rank() && !t->ranks_->Bytes(s.id).empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("special token ", s.text, " reuses base rank ", s.id));
    }
  }
  auto sp = SpecialTokens::FromList(std::move(specials));
  if (!sp.ok()) return sp.status();
  t->specials_ = *std::move(sp);
  t->vocab_size_ = t->ranks_->end_rank();
  for (const SpecialToken& s : t->specials_.all())
    t->vocab_size_ = std::max(t->vocab_size_, s.id + 1);
  return t;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& model_dir) {
  auto ranks_text = ReadFile(model_dir + "/tiktoken.model");
  if (!ranks_text.ok()) return ranks_text.status();
  auto config_text = ReadFile(model_dir + "/tokenizer_config.json");
  if (!config_text.ok()) return config_text.status();
  auto ranks = BpeRanks::Parse(*ranks_text);
  if (!ranks.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(model_dir, "/tiktoken.model: ", ranks.status().message()));
  }
  // tokenization_kimi.py: num_base_tokens = len(mergeable_ranks); specials follow.
  const int32_t num_base = ranks->num_ranks();
  if (ranks->end_rank() != num_base) {
    return absl::InvalidArgumentError(
        absl::StrCat(model_dir, "/tiktoken.model: ranks are not dense (", num_base,
                     " tokens, largest rank ", ranks->end_rank() - 1, ")"));
  }
  auto specials = SpecialTokens::FromTokenizerConfig(*config_text, num_base);
  if (!specials.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(model_dir, "/", specials.status().message()));
  }
  auto tok = std::unique_ptr<Tokenizer>(new Tokenizer());
  tok->ranks_ = std::make_unique<BpeRanks>(*std::move(ranks));
  auto translated = TranslatePattern(kKimiPattern);
  if (!translated.ok()) return translated.status();
  auto pre = Pretokenizer::Create(*translated);
  if (!pre.ok()) return pre.status();
  tok->pretokenizer_ = *std::move(pre);
  tok->specials_ = *std::move(specials);
  tok->kimi_chunking_ = true;
  tok->vocab_size_ = num_base;
  for (const SpecialToken& s : tok->specials_.all()) {
    tok->vocab_size_ = std::max(tok->vocab_size_, s.id + 1);
  }

  // Stop ids: every end-of-turn id the checkpoint names.
  std::vector<int32_t> stops;
  for (const char* name : {"[EOS]", "[EOT]", "<|im_end|>", "<|end_of_msg|>"}) {
    if (auto id = tok->specials_.Id(name)) stops.push_back(*id);
  }
  if (const auto& eos = tok->specials_.eos_token()) {
    if (auto id = tok->specials_.Id(*eos)) stops.push_back(*id);
  }
  for (const char* file : {"/config.json", "/generation_config.json"}) {
    auto text = ReadFile(model_dir + file);
    if (!text.ok()) continue;  // optional files
    const auto j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) {
      return absl::InvalidArgumentError(absl::StrCat(model_dir, file, " is not valid JSON"));
    }
    CollectEosIds(j, &stops);
  }
  std::sort(stops.begin(), stops.end());
  stops.erase(std::unique(stops.begin(), stops.end()), stops.end());
  for (int32_t id : stops) {  // an id no token has would never stop anything
    if (id < 0 || id >= tok->vocab_size_) {
      return absl::InvalidArgumentError(absl::StrCat(model_dir, ": eos_token_id ", id,
                                                     " is not a token id (the tokenizer has ",
                                                     tok->vocab_size_, ")"));
    }
  }
  tok->stop_token_ids_ = std::move(stops);

  // A template that is there must be a file with something in it: a directory, or an empty file,
  // loaded and then made every chat prompt "encode to no tokens".
  const std::string template_path = model_dir + "/chat_template.jinja";
  std::error_code ec;
  if (std::filesystem::exists(template_path, ec) &&
      !std::filesystem::is_regular_file(template_path, ec)) {
    return absl::InvalidArgumentError(absl::StrCat(template_path, ": not a regular file"));
  }
  if (auto source = ReadFile(template_path); source.ok()) {
    if (source->find_first_not_of(" \t\r\n") == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(template_path, ": the template is empty"));
    }
    // Every <|marker|> the template writes must be a token the checkpoint defines: one missing
    // from tokenizer_config.json (a K3 checkpoint without its added tokens) was encoded as plain
    // text, and every chat prompt came out garbled without a word.
    for (size_t at = source->find("<|"); at != std::string::npos; at = source->find("<|", at + 2)) {
      const size_t end = source->find("|>", at + 2);
      if (end == std::string::npos || end - at > 64) continue;
      const std::string marker = source->substr(at, end + 2 - at);
      const bool plain = std::all_of(marker.begin() + 2, marker.end() - 2, [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
      });
      if (plain && !tok->specials_.Id(marker)) {
        return absl::InvalidArgumentError(absl::StrCat(
            template_path, ": the template writes ", marker,
            ", which tokenizer_config.json does not define as a token (it would be plain text)"));
      }
    }
    auto tmpl = ChatTemplate::Parse(*source);
    if (!tmpl.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(model_dir, "/chat_template.jinja: ", tmpl.status().message()));
    }
    tok->chat_template_ = *std::move(tmpl);
  }
  return tok;
}

int32_t Tokenizer::num_base_tokens() const { return ranks_->end_rank(); }

void Tokenizer::EncodeChunk(absl::string_view text, std::vector<int32_t>* out) const {
  pretokenizer_->Split(text, [&](absl::string_view piece) { ranks_->EncodePiece(piece, out); });
}

void Tokenizer::EncodeOrdinary(absl::string_view text, std::vector<int32_t>* out) const {
  if (!kimi_chunking_ || text.size() <= kKimiMaxRunChars) {  // bytes >= chars: no cut possible
    EncodeChunk(text, out);
    return;
  }
  // One pass doing both of tokenization_kimi.py's cuts, char by char (an invalid byte is a char).
  size_t slice_start = 0;
  size_t window_chars = 0;
  size_t run_len = 0;
  bool run_is_space = false;
  for (size_t i = 0; i < text.size();) {
    uint32_t cp = 0xFFFD;
    size_t len = DecodeUtf8(text, i, &cp);
    if (len == 0) len = 1;
    if (window_chars == kKimiWindowChars) {  // a new window starts with fresh run state
      EncodeChunk(text.substr(slice_start, i - slice_start), out);
      slice_start = i;
      window_chars = 0;
    }
    const bool space = IsPythonSpace(cp);
    if (window_chars == 0) run_is_space = space, run_len = 0;
    if (space != run_is_space) {
      run_len = 1;
      run_is_space = space;
    } else if (++run_len > kKimiMaxRunChars) {
      EncodeChunk(text.substr(slice_start, i - slice_start), out);
      slice_start = i;
      run_len = 1;
    }
    ++window_chars;
    i += len;
  }
  EncodeChunk(text.substr(slice_start), out);
}

std::vector<int32_t> Tokenizer::Encode(absl::string_view text, bool allow_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 1);
  size_t pos = 0, b = 0, e = 0;
  int32_t id = 0;
  while (allow_special && specials_.FindNext(text, pos, &b, &e, &id)) {
    EncodeOrdinary(text.substr(pos, b - pos), &out);
    out.push_back(id);
    pos = e;
  }
  EncodeOrdinary(text.substr(pos), &out);
  return out;
}

std::string Tokenizer::Decode(std::span<const int32_t> ids) const {
  std::string out;
  for (int32_t id : ids) {
    absl::string_view bytes = ranks_->Bytes(id);
    if (!bytes.empty()) {
      out.append(bytes.data(), bytes.size());
    } else if (const SpecialToken* s = specials_.Find(id)) {
      out += s->text;
    }
  }
  return out;
}

std::optional<int32_t> Tokenizer::TokenId(absl::string_view special_text) const {
  return specials_.Id(special_text);
}

std::string Tokenizer::TokenText(int32_t id) const {
  const int32_t one[1] = {id};
  return Decode(one);
}

bool Tokenizer::IsSpecial(int32_t id) const {
  const SpecialToken* t = specials_.Find(id);
  return t != nullptr && t->special;
}

absl::StatusOr<std::string> Tokenizer::RenderChatText(const std::vector<ChatMessage>& messages,
                                                      const ChatOptions& options) const {
  auto ids = RenderChat(messages, options);
  if (!ids.ok()) return ids.status();
  return Decode(*ids);
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::RenderChat(const std::vector<ChatMessage>& messages,
                                                           const ChatOptions& options) const {
  absl::StatusOr<Prompt> prompt;
  if (chat_template_) {
    TemplateTokens names;
    if (specials_.Id("[BOS]")) names.bos_token = "[BOS]";
    if (const auto& eos = specials_.eos_token()) names.eos_token = *eos;
    prompt = chat_template_->Render(messages, options, names);
  } else {
    for (const std::string& name : KimiLinearChatTokens()) {
      if (!specials_.Id(name)) {
        return absl::FailedPreconditionError(
            absl::StrCat("the checkpoint has no chat_template.jinja and no ", name,
                         " token, so the built-in Kimi Linear chat format cannot be used"));
      }
    }
    prompt = RenderKimiLinearChat(messages, options);
  }
  if (!prompt.ok()) return prompt.status();
  // Specials only from trusted text; ordinary text is encoded across piece boundaries, as if the
  // whole rendered string were encoded.
  std::vector<int32_t> ids;
  std::string pending;
  for (const PromptSegment& seg : *prompt) {
    if (!seg.trusted) {
      pending += seg.text;
      continue;
    }
    size_t pos = 0, b = 0, e = 0;
    int32_t id = 0;
    while (specials_.FindNext(seg.text, pos, &b, &e, &id)) {
      pending.append(seg.text, pos, b - pos);
      EncodeOrdinary(pending, &ids);
      pending.clear();
      ids.push_back(id);
      pos = e;
    }
    pending.append(seg.text, pos, std::string::npos);
  }
  EncodeOrdinary(pending, &ids);
  return ids;
}

}  // namespace kimi::tokenizer
