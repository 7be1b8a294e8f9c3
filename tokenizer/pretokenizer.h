// Pre-tokenisation: the regex that cuts text into pieces before BPE, run by PCRE2 (UTF + UCP, JIT).
// tiktoken patterns are written for Rust's regex engine; TranslatePattern rewrites the parts whose
// meaning differs in PCRE2 (see pretokenizer.cc for each rewrite and why it is equivalent).
#pragma once

#include <memory>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kimi::tokenizer {

// Kimi's pattern (KIMI_LINEAR.md section 4, tokenization_kimi.py `pat_str`), verbatim in Rust regex
// syntax, including its `&&[^\p{Han}]` class intersections.
extern const char kKimiPattern[];

// Rewrites a Rust-regex (tiktoken) pattern into an equivalent PCRE2 pattern. Fails on constructs it
// cannot translate exactly (\w, \b, class difference, ...), never guesses.
absl::StatusOr<std::string> TranslatePattern(absl::string_view rust_pattern);

// As TranslatePattern, but class intersections always use the generic lookahead form
// `(?:(?=B)[A])` instead of the single-class complement form; tests prove the two agree.
absl::StatusOr<std::string> TranslatePatternWithLookaheads(absl::string_view rust_pattern);

// The Unicode version of PCRE2's property tables (Debian 12's PCRE2 10.42: "14.0.0").
std::string Pcre2UnicodeVersion();

class Pretokenizer {
 public:
  // Compiles a PCRE2 pattern (already translated), UTF + UCP, with JIT when available.
  static absl::StatusOr<std::unique_ptr<Pretokenizer>> Create(absl::string_view pcre2_pattern);
  ~Pretokenizer();
  Pretokenizer(const Pretokenizer&) = delete;
  Pretokenizer& operator=(const Pretokenizer&) = delete;

  // Calls `piece` for consecutive pieces that together are exactly `text`: the regex matches and,
  // between them, any bytes no match covers (with the shipped patterns, only invalid UTF-8, which
  // never matches). tiktoken drops unmatched text; we keep it so decode(encode(s)) == s always.
  // Thread-safe.
  void Split(absl::string_view text, absl::FunctionRef<void(absl::string_view)> piece) const;

  // True when the whole of `text` matches the pattern (for tests of single-character classes).
  bool FullMatch(absl::string_view text) const;

  const std::string& pattern() const { return pattern_; }

 private:
  Pretokenizer() = default;
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
};

}  // namespace kimi::tokenizer
