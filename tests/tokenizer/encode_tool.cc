// kimi-tokenizer-encode: the C++ side of the npm tiktoken cross-check (tiktoken_crosscheck.js).
//   kimi-tokenizer-encode --print-kimi-pattern
//   kimi-tokenizer-encode --ranks FILE --pattern-file FILE [--specials FILE] [--lookahead-form]
// stdin: one request per line, "<mode> <base64 of UTF-8 text>", mode o = ordinary, s = special
// tokens allowed. stdout: one line each, "<ids separated by spaces>\t<1 if decode(ids) == text>".
// --specials: a JSON object {"<text>": id}. --lookahead-form: class intersections use the generic
// lookahead rewrite instead of the complement class (both must match tiktoken).
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "absl/strings/escaping.h"
#include "nlohmann/json.hpp"
#include "tokenizer/pretokenizer.h"
#include "tokenizer/tokenizer.h"

namespace {

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::stringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return true;
}

std::string Utf8(uint32_t c) {
  std::string s;
  if (c < 0x80) {
    s += static_cast<char>(c);
  } else if (c < 0x800) {
    s += static_cast<char>(0xC0 | (c >> 6));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    s += static_cast<char>(0xE0 | (c >> 12));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (c >> 18));
    s += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  std::string ranks_path, pattern_path, specials_path;
  bool lookahead = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--print-kimi-pattern") {
      std::cout << kimi::tokenizer::kKimiPattern;
      return 0;
    }
    if (a == "--print-unassigned") {
      // PCRE2's Unicode version, then the ranges it classes as unassigned (Cn), "lo hi" in hex.
      auto cn = kimi::tokenizer::Pretokenizer::Create(R"(\p{Cn})");
      if (!cn.ok()) return 1;
      std::cout << kimi::tokenizer::Pcre2UnicodeVersion() << "\n";
      int64_t start = -1;
      for (uint32_t c = 0; c <= 0x110000; ++c) {
        const bool un = c < 0x110000 && (c < 0xD800 || c > 0xDFFF) && (*cn)->FullMatch(Utf8(c));
        if (un && start < 0) start = c;
        if (!un && start >= 0) {
          std::cout << std::hex << start << " " << c - 1 << std::dec << "\n";
          start = -1;
        }
      }
      return 0;
    }
    if (a == "--lookahead-form") {
      lookahead = true;
    } else if (i + 1 < argc && a == "--ranks") {
      ranks_path = argv[++i];
    } else if (i + 1 < argc && a == "--pattern-file") {
      pattern_path = argv[++i];
    } else if (i + 1 < argc && a == "--specials") {
      specials_path = argv[++i];
    } else {
      std::cerr << "unknown argument " << a << "\n";
      return 2;
    }
  }
  std::string ranks, pattern, specials_text;
  if (!ReadFile(ranks_path, &ranks) || !ReadFile(pattern_path, &pattern)) {
    std::cerr << "cannot read --ranks or --pattern-file\n";
    return 2;
  }
  std::vector<kimi::tokenizer::SpecialToken> specials;
  if (!specials_path.empty()) {
    if (!ReadFile(specials_path, &specials_text)) return 2;
    const auto j = nlohmann::json::parse(specials_text, nullptr, false);
    if (!j.is_object()) return 2;
    for (const auto& [text, id] : j.items()) specials.push_back({text, id.get<int32_t>(), true});
  }
  auto translated = lookahead ? kimi::tokenizer::TranslatePatternWithLookaheads(pattern)
                              : kimi::tokenizer::TranslatePattern(pattern);
  if (!translated.ok()) {
    std::cerr << translated.status() << "\n";
    return 1;
  }
  auto tok = kimi::tokenizer::Tokenizer::FromPartsPcre2(ranks, *translated, specials);
  if (!tok.ok()) {
    std::cerr << tok.status() << "\n";
    return 1;
  }
  std::string line, text;
  while (std::getline(std::cin, line)) {
    if (line.size() < 2 || !absl::Base64Unescape(line.substr(2), &text)) {
      if (line.size() == 2) {
        text.clear();
      } else {
        std::cerr << "bad request line\n";
        return 2;
      }
    }
    const std::vector<int32_t> ids = (*tok)->Encode(text, /*allow_special=*/line[0] == 's');
    std::string out;
    for (size_t k = 0; k < ids.size(); ++k) {
      if (k) out += ' ';
      out += std::to_string(ids[k]);
    }
    out += (*tok)->Decode(ids) == text ? "\t1\n" : "\t0\n";
    std::cout << out;
  }
  return 0;
}
