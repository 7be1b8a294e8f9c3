#include "tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <algorithm>
#include <array>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include <pcre2.h>

namespace kimi::tokenizer {

// The pattern of tokenization_kimi.py, one alternative per line there, joined with "|".
const char kKimiPattern[] =
    R"([\p{Han}]+)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|\p{N}{1,3})"
    R"(| ?[^\s\p{L}\p{N}]+[\r\n]*)"
    R"(|\s*[\r\n]+)"
    R"(|\s+(?!\S))"
    R"(|\s+)";

namespace {

// ---------------------------------------------------------------------------------------------
// Rewrites, each exact:
//
// 1. `\s` / `\S`. Rust's Unicode `\s` is the White_Space property. PCRE2's UCP `\s` is \p{Z} or
//    \h or \v, which is White_Space plus U+180E (MONGOLIAN VOWEL SEPARATOR, no longer a space
//    since Unicode 6.3). So `\s` becomes the explicit White_Space list below (inside a class: the
//    list's items; outside: `[list]`) and `\S` outside a class becomes `[^list]`.
// 2. `\p{Name}` for a script. Rust resolves a bare name to a general category first, else to a
//    *Script* (Script_Extensions needs `scx=`). PCRE2 >= 10.40 resolves a bare script name to
//    Script_Extensions, which for Han also takes U+3001 `、`, U+30FC `ー` and other shared
//    punctuation. So a bare name that is not a general category becomes `\p{sc:Name}`.
// 3. Class intersection `[A&&B]` (Rust only). A char is in the intersection iff it is in A and in
//    B. Generic form: `(?:(?=[B])[A])`: the lookahead and the class examine the same single code
//    point, and the group consumes exactly that one, so under any quantifier each iteration
//    takes one char that is in both. Complement form, used when A is a union of general
//    categories and B is a negated class `[^B1..Bk]`: c in A and c not in any Bi  <=>  not (c in
//    the categories A lacks, or c in some Bi)  <=>  c matches `[^<categories A lacks>B1..Bk]`.
//    This is exact because the general categories partition every code point (unassigned ones
//    are Cn, part of C). Kimi's `[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]` therefore becomes
//    `[^\p{Ll}\p{N}\p{P}\p{S}\p{Z}\p{C}\p{sc:Han}]`: one class, no per-char lookahead.
// 4. `\d`/`\D`: Rust's Unicode \d is \p{Nd}; written out so the meaning does not rest on flags.
// 5. `$` means end of text in Rust; PCRE2_DOLLAR_ENDONLY gives PCRE2 the same meaning.
// Everything else used by tiktoken patterns (alternation, greedy quantifiers, `(?i:...)` with
// Unicode simple case folding, lookahead) means the same in both engines; anything the
// translator does not know (\w, \b, class difference `--`, POSIX classes, ...) is an error.
// ---------------------------------------------------------------------------------------------

constexpr char kWhiteSpaceItems[] =
    R"(\x{9}-\x{D}\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";

// General categories: the 7 major ones and their 30 leaves.
struct MajorCategory {
  const char* name;
  std::vector<const char*> leaves;
};
const std::vector<MajorCategory>& Categories() {
  static const auto* cats = new std::vector<MajorCategory>{
      {"L", {"Lu", "Ll", "Lt", "Lm", "Lo"}},
      {"M", {"Mn", "Mc", "Me"}},
      {"N", {"Nd", "Nl", "No"}},
      {"P", {"Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po"}},
      {"S", {"Sm", "Sc", "Sk", "So"}},
      {"Z", {"Zs", "Zl", "Zp"}},
      {"C", {"Cc", "Cf", "Cs", "Co", "Cn"}},
  };
  return *cats;
}

bool IsGeneralCategory(absl::string_view name) {
  for (const auto& m : Categories()) {
    if (name == m.name) return true;
    for (const char* leaf : m.leaves) {
      if (name == leaf) return true;
    }
  }
  return false;
}

// One operand of a class: PCRE2 items valid inside `[...]`, plus what the optimiser needs.
struct ClassSet {
  bool negated = false;
  std::string items;                 // PCRE2 syntax, without brackets
  std::vector<std::string> gc_only;  // the general categories, when every item is `\p{gc}`
  bool all_gc = true;
  std::string Pcre2() const { return absl::StrCat("[", negated ? "^" : "", items, "]"); }
};

class Translator {
 public:
  Translator(absl::string_view p, bool complement_form) : p_(p), complement_(complement_form) {}

  absl::StatusOr<std::string> Run() {
    std::string out;
    while (i_ < p_.size()) {
      const char c = p_[i_];
      if (c == '\\') {
        auto esc = Escape(/*in_class=*/false);
        if (!esc.ok()) return esc.status();
        out += *esc;
      } else if (c == '[') {
        auto cls = Class();
        if (!cls.ok()) return cls.status();
        out += *cls;
      } else {
        out += c;
        ++i_;
      }
    }
    return out;
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("pre-tokeniser pattern: ", what, " at offset ", i_, " is not supported"));
  }

  // Reads `\p{Name}`, `\pL`, `\P{..}` at i_ (after the backslash and letter). Returns the name.
  absl::StatusOr<std::string> PropertyName() {
    if (i_ < p_.size() && p_[i_] == '{') {
      const size_t close = p_.find('}', i_);
      if (close == absl::string_view::npos) return Error("unterminated \\p{");
      std::string name(p_.substr(i_ + 1, close - i_ - 1));
      i_ = close + 1;
      return name;
    }
    if (i_ >= p_.size()) return Error("dangling \\p");
    return std::string(1, p_[i_++]);
  }

  static std::string MapProperty(const std::string& name) {
    if (IsGeneralCategory(name) || name.find_first_of("=:") != std::string::npos) return name;
    return "sc:" + name;  // rewrite 2
  }

  // Translates one escape at i_ (pointing at the backslash). In a class the result is class items.
  // `gc` receives the general category when the escape is a plain \p{gc}.
  absl::StatusOr<std::string> Escape(bool in_class, std::string* gc = nullptr) {
    if (i_ + 1 >= p_.size()) return Error("trailing backslash");
    const char e = p_[i_ + 1];
    const size_t start = i_;
    i_ += 2;
    switch (e) {
      case 's':
        return in_class ? std::string(kWhiteSpaceItems) : absl::StrCat("[", kWhiteSpaceItems, "]");
      case 'S':
        if (in_class) return Error("\\S inside a class");
        return absl::StrCat("[^", kWhiteSpaceItems, "]");
      case 'd':
        return std::string(in_class ? R"(\p{Nd})" : R"(\p{Nd})");
      case 'D':
        return std::string(R"(\P{Nd})");
      case 'p':
      case 'P': {
        auto name = PropertyName();
        if (!name.ok()) return name.status();
        const std::string mapped = MapProperty(*name);
        if (gc && e == 'p' && IsGeneralCategory(mapped)) *gc = mapped;
        return absl::StrCat("\\", std::string(1, e), "{", mapped, "}");
      }
      case 'w':
      case 'W':
      case 'b':
      case 'B':
        i_ = start;
        return Error(absl::StrCat("\\", std::string(1, e)));
      case 'x': {
        if (i_ < p_.size() && p_[i_] == '{') {
          const size_t close = p_.find('}', i_);
          if (close == absl::string_view::npos) return Error("unterminated \\x{");
          std::string hex(p_.substr(i_ + 1, close - i_ - 1));
          i_ = close + 1;
          return absl::StrCat("\\x{", hex, "}");
        }
        if (i_ + 2 > p_.size()) return Error("short \\x");
        std::string hex(p_.substr(i_, 2));
        i_ += 2;
        return absl::StrCat("\\x{", hex, "}");
      }
      default:
        // \r \n \t \f \v and escaped punctuation mean the same in both engines.
        if (std::isalnum(static_cast<unsigned char>(e)) &&
            std::string("rntfv").find(e) == std::string::npos) {
          i_ = start;
          return Error(absl::StrCat("escape \\", std::string(1, e)));
        }
        return std::string(p_.substr(start, 2));
    }
  }

  // Parses a Rust class operand: items up to `&&` or the closing `]` of the current class.
  absl::StatusOr<ClassSet> Operand() {
    ClassSet set;
    bool first = true;
    while (i_ < p_.size()) {
      const char c = p_[i_];
      if (c == ']' && !first) break;
      if (p_.substr(i_, 2) == "&&") break;
      if (p_.substr(i_, 2) == "--" || p_.substr(i_, 2) == "~~") return Error("class set operator");
      if (p_.substr(i_, 2) == "[:") return Error("POSIX class");
      first = false;
      if (c == '[') {
        auto nested = NestedClass();
        if (!nested.ok()) return nested.status();
        if (nested->negated) {
          // A lone negated nested class is the operand itself (e.g. `&&[^\p{Han}]`).
          if (!set.items.empty() || (i_ < p_.size() && p_[i_] != ']' && p_.substr(i_, 2) != "&&")) {
            return Error("negated class inside a union");
          }
          return *nested;
        }
        set.items += nested->items;
        set.all_gc = set.all_gc && nested->all_gc;
        set.gc_only.insert(set.gc_only.end(), nested->gc_only.begin(), nested->gc_only.end());
        continue;
      }
      if (c == '\\') {
        std::string gc;
        auto esc = Escape(/*in_class=*/true, &gc);
        if (!esc.ok()) return esc.status();
        set.items += *esc;
        if (gc.empty()) {
          set.all_gc = false;
        } else {
          set.gc_only.push_back(gc);
        }
        continue;
      }
      // A literal (possibly a range a-b): copied as is; PCRE2 reads the same bytes the same way.
      set.all_gc = false;
      set.items += c;
      ++i_;
    }
    return set;
  }

  // Parses `[...]` at i_ into one operand (no intersection allowed at this nesting level).
  absl::StatusOr<ClassSet> NestedClass() {
    ++i_;  // '['
    bool negated = false;
    if (i_ < p_.size() && p_[i_] == '^') {
      negated = true;
      ++i_;
    }
    auto set = Operand();
    if (!set.ok()) return set.status();
    if (i_ >= p_.size() || p_[i_] != ']') return Error("intersection inside a nested class");
    ++i_;
    set->negated = negated;
    if (negated) set->all_gc = false;
    return set;
  }

  // The categories (leaf or major names) that are not covered by `gcs`.
  static std::string ComplementCategories(const std::vector<std::string>& gcs) {
    std::set<std::string> have(gcs.begin(), gcs.end());
    std::string out;
    for (const auto& m : Categories()) {
      if (have.count(m.name)) continue;
      std::vector<const char*> missing;
      for (const char* leaf : m.leaves) {
        if (!have.count(leaf)) missing.push_back(leaf);
      }
      if (missing.size() == m.leaves.size()) {
        absl::StrAppend(&out, "\\p{", m.name, "}");
      } else {
        for (const char* leaf : missing) absl::StrAppend(&out, "\\p{", leaf, "}");
      }
    }
    return out;
  }

  // Translates a whole top-level class at i_, intersections included (rewrite 3).
  absl::StatusOr<std::string> Class() {
    ++i_;  // '['
    bool negated = false;
    if (i_ < p_.size() && p_[i_] == '^') {
      negated = true;
      ++i_;
    }
    std::vector<ClassSet> operands;
    while (true) {
      auto set = Operand();
      if (!set.ok()) return set.status();
      operands.push_back(*std::move(set));
      if (p_.substr(i_, 2) == "&&") {
        i_ += 2;
        continue;
      }
      break;
    }
    if (i_ >= p_.size() || p_[i_] != ']') return Error("unterminated class");
    ++i_;
    if (operands.size() == 1) {
      ClassSet only = operands[0];
      if (only.negated) {
        // `[[^x]]` or `[^[^x]]`: double negation is not worth supporting.
        if (negated) return Error("negated class inside a negated class");
        return only.Pcre2();
      }
      only.negated = negated;
      return only.Pcre2();
    }
    if (negated) return Error("negated intersection");
    const ClassSet& a = operands[0];
    if (complement_ && operands.size() == 2 && !a.negated && a.all_gc && !a.gc_only.empty() &&
        operands[1].negated) {
      return absl::StrCat("[^", ComplementCategories(a.gc_only), operands[1].items, "]");
    }
    std::string out = "(?:";
    for (size_t k = 1; k < operands.size(); ++k) {
      absl::StrAppend(&out, "(?=", operands[k].Pcre2(), ")");
    }
    absl::StrAppend(&out, a.Pcre2(), ")");
    return out;
  }

  absl::string_view p_;
  bool complement_;
  size_t i_ = 0;
};

// Per-thread PCRE2 scratch: one match-data block and a JIT stack, shared by every pattern.
struct MatchScratch {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_jit_stack* jit_stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
  pcre2_match_context* context = [this] {
    pcre2_match_context* c = pcre2_match_context_create(nullptr);
    if (c && jit_stack) pcre2_jit_stack_assign(c, nullptr, jit_stack);
    return c;
  }();
  ~MatchScratch() {
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(jit_stack);
    pcre2_match_data_free(data);
  }
};

MatchScratch& Scratch() {
  thread_local MatchScratch scratch;
  return scratch;
}

}  // namespace

absl::StatusOr<std::string> TranslatePattern(absl::string_view rust_pattern) {
  return Translator(rust_pattern, /*complement_form=*/true).Run();
}

absl::StatusOr<std::string> TranslatePatternWithLookaheads(absl::string_view rust_pattern) {
  return Translator(rust_pattern, /*complement_form=*/false).Run();
}

absl::StatusOr<std::unique_ptr<Pretokenizer>> Pretokenizer::Create(absl::string_view pattern) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  // MATCH_INVALID_UTF: invalid UTF-8 is never matched (nor crashed on); Split keeps it as gaps.
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | PCRE2_DOLLAR_ENDONLY, &error,
                    &offset, nullptr);
  if (code == nullptr) {
    std::array<PCRE2_UCHAR, 256> msg{};
    pcre2_get_error_message(error, msg.data(), msg.size());
    return absl::InvalidArgumentError(absl::StrCat("PCRE2 cannot compile the pattern at offset ",
                                                   offset, ": ",
                                                   reinterpret_cast<const char*>(msg.data())));
  }
  auto p = std::unique_ptr<Pretokenizer>(new Pretokenizer());
  p->pattern_ = std::string(pattern);
  p->code_ = code;
  p->jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return p;
}

std::string Pcre2UnicodeVersion() {
  std::array<char, 64> buf{};
  if (pcre2_config(PCRE2_CONFIG_UNICODE_VERSION, buf.data()) < 0) return "unknown";
  return std::string(buf.data());
}

bool Pretokenizer::FullMatch(absl::string_view text) const {
  MatchScratch& s = Scratch();
  if (s.data == nullptr) return false;
  // Match-time anchoring is not available to JIT code; the interpreter handles it.
  const int rc =
      pcre2_match(static_cast<const pcre2_code*>(code_), reinterpret_cast<PCRE2_SPTR>(text.data()),
                  text.size(), 0, PCRE2_ANCHORED | PCRE2_ENDANCHORED, s.data, nullptr);
  return rc >= 0;
}

Pretokenizer::~Pretokenizer() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void Pretokenizer::Split(absl::string_view text,
                         absl::FunctionRef<void(absl::string_view)> piece) const {
  const auto* code = static_cast<const pcre2_code*>(code_);
  MatchScratch& s = Scratch();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const size_t n = text.size();
  size_t emitted = 0;  // text[0, emitted) has been handed out
  size_t start = 0;    // where the next search begins
  while (start < n && s.data != nullptr) {
    const int rc = jit_ ? pcre2_jit_match(code, subject, n, start, 0, s.data, s.context)
                        : pcre2_match(code, subject, n, start, 0, s.data, s.context);
    if (rc < 0) break;  // no more matches, or a resource limit: the rest becomes one gap piece
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(s.data);
    const size_t b = ov[0], e = ov[1];
    if (b < emitted || e < b || e > n) break;
    if (e == b) {  // an empty match takes nothing; step over one UTF-8 sequence
      start = b + 1;
      while (start < n && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) ++start;
      continue;
    }
    if (b > emitted) piece(text.substr(emitted, b - emitted));
    piece(text.substr(b, e - b));
    emitted = start = e;
  }
  if (emitted < n) piece(text.substr(emitted));
}

}  // namespace kimi::tokenizer
