// Helpers for the tokenizer tests: vocabularies and synthetic checkpoint directories laid out as
// kimi-mkmodel writes them (tiktoken.model, tokenizer_config.json, config.json).
#pragma once

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "tests/temp_dir.h"
#include "tokenizer/tokenizer.h"

namespace kimi::tokenizer::testing {

inline ChatMessage Msg(std::string role, std::string content, std::string name = "") {
  ChatMessage m;
  m.role = std::move(role);
  m.content = std::move(content);
  m.name = std::move(name);
  return m;
}

inline std::string SourceDir() {
  const char* s = std::getenv("KIMI_SOURCE_DIR");
  return s ? s : ".";
}

inline std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

// cl100k_base ranks in tiktoken format, from ./scripts/fetch_vocab.sh. Empty (and the test
// fails with the reason) when missing.
inline std::string Cl100kRanks() {
  const std::string path = SourceDir() + "/models/cl100k_base.tiktoken";
  std::string text = ReadText(path);
  if (text.empty()) {
    ADD_FAILURE() << path << " is missing: run ./scripts/fetch_vocab.sh (./scripts/test.sh does)";
  }
  return text;
}

// The 256 single bytes (ranks 0-255) plus `merges` in order (ranks 256...).
inline std::string ByteRanks(const std::vector<std::string>& merges = {}) {
  std::string text;
  for (int b = 0; b < 256; ++b) {
    absl::StrAppend(&text, absl::Base64Escape(std::string(1, static_cast<char>(b))), " ", b, "\n");
  }
  int rank = 256;
  for (const std::string& m : merges)
    absl::StrAppend(&text, absl::Base64Escape(m), " ", rank++, "\n");
  return text;
}

// Special tokens by offset from the first special id (KIMI_LINEAR.md 4, KIMI_K3.md 4b).
inline std::vector<std::pair<int, std::pair<std::string, bool>>> FamilySpecials(bool k3) {
  if (k3) {
    return {{0, {"[BOS]", true}},
            {1, {"[EOS]", true}},
            {2, {"<|end_of_msg|>", true}},
            {3, {"<|open|>", false}},
            {4, {"<|close|>", false}},
            {5, {"<|sep|>", false}},
            {6, {"[start_header_id]", true}},
            {7, {"[end_header_id]", true}},
            {9, {"[EOT]", true}},
            {18, {"<|media_begin|>", true}},
            {19, {"<|media_content|>", true}},
            {20, {"<|media_end|>", true}},
            {21, {"<|media_pad|>", true}},
            {65, {"<osagent_mode>", true}},
            {254, {"[UNK]", true}},
            {255, {"[PAD]", true}}};
  }
  return {{0, {"[BOS]", true}},
          {1, {"[EOS]", true}},
          {2, {"<|im_end|>", true}},
          {3, {"<|im_user|>", true}},
          {4, {"<|im_assistant|>", true}},
          {6, {"<|start_header_id|>", true}},
          {7, {"<|end_header_id|>", true}},
          {9, {"[EOT]", true}},
          {10, {"<|im_system|>", true}},
          {11, {"<|tool_calls_section_begin|>", false}},
          {12, {"<|tool_calls_section_end|>", false}},
          {13, {"<|tool_call_begin|>", false}},
          {14, {"<|tool_call_argument_begin|>", false}},
          {15, {"<|tool_call_end|>", false}},
          {17, {"<|im_middle|>", true}},
          {254, {"[UNK]", true}},
          {255, {"[PAD]", true}}};
}

inline int CountRanks(const std::string& ranks) {
  int n = 0;
  for (char c : ranks) n += c == '\n';
  return n;
}

using kimi::testing::TempDir;

// Writes a checkpoint's tokenizer files: only the listed specials appear in
// added_tokens_decoder (the rest of the 256 are reserved by rule), like a real config.
inline std::string WriteModelDir(const std::string& name, const std::string& ranks, bool k3,
                                 const std::string& chat_template = "") {
  const std::string dir = TempDir(name);
  const int base = CountRanks(ranks);
  WriteText(dir + "/tiktoken.model", ranks);
  nlohmann::json added = nlohmann::json::object();
  for (const auto& [off, tok] : FamilySpecials(k3)) {
    added[std::to_string(base + off)] = {
        {"content", tok.first}, {"special", tok.second}, {"lstrip", false}, {"rstrip", false}};
  }
  nlohmann::json cfg = {{"added_tokens_decoder", added},
                        {"bos_token", "[BOS]"},
                        {"eos_token", "[EOS]"},
                        {"tokenizer_class", "TikTokenTokenizer"}};
  WriteText(dir + "/tokenizer_config.json", cfg.dump(2));
  nlohmann::json config = {{"eos_token_id", base + 2}, {"bos_token_id", base}};
  if (k3) config = {{"eos_token_id", base + 2}, {"text_config", {{"eos_token_id", base + 2}}}};
  WriteText(dir + "/config.json", config.dump(2));
  if (!chat_template.empty()) WriteText(dir + "/chat_template.jinja", chat_template);
  return dir;
}

}  // namespace kimi::tokenizer::testing
