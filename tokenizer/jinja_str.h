// Python's str operations that chat templates call (through jinja2's filters and str methods), on
// UTF-8 text counted in code points as Python counts. Private to tokenizer/.
//
// Case mapping is a small table, not the whole Unicode database (no ICU here): ASCII, Latin-1
// Supplement, Latin Extended-A, Greek and Coptic (U+0370-U+03FF) and Cyrillic with its Supplement
// (U+0400-U+052F), the one-to-one mappings plus Python's one-to-many ones there (ß upper is SS, ŉ
// is ʼN, ΐ and ΰ take three code points, İ lower is i + U+0307) and the final-sigma rule of lower.
// Other scripts pass through unchanged.
#pragma once

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"

namespace kimi::tokenizer::jinja {

std::string PyUpper(absl::string_view s);
std::string PyLower(absl::string_view s);
// str.capitalize() (3.8+): the first code point in title case, the rest lower.
std::string PyCapitalize(absl::string_view s);
// str.title(): title case after an uncased code point, lower case after a cased one.
std::string PyTitle(absl::string_view s);
// jinja2's `title` filter, which is not str.title(): words split at runs of whitespace and
// -({[<, each word's first code point upper and the rest lower.
std::string JinjaTitle(absl::string_view s);
// str.strip/lstrip/rstrip: `chars` null strips Unicode whitespace (str.isspace()), otherwise any of
// the code points in *chars.
std::string PyStrip(absl::string_view s, const std::string* chars, bool left, bool right);
// str.replace(old, new, count); count < 0 replaces all. An empty `old` matches between code
// points, as in Python ('ab'.replace('', '-') is '-a-b-').
std::string PyReplace(absl::string_view s, absl::string_view old, absl::string_view repl,
                      int64_t count);
// Python's float(str): whitespace around, a sign, decimal digits (single underscores between
// them), a point, an exponent; or inf, infinity, nan in any case. False when it is none of these.
bool PyParseFloat(absl::string_view s, double* out);
// Python's int(str, base) for base 0 or 2..36: whitespace around, a sign, digits (single
// underscores between them), a 0x/0o/0b prefix that matches the base (base 0: the prefix picks it,
// and a decimal may not start with 0). Only ASCII digits.
enum class PyIntParse { kOk, kInvalid, kOutOfRange /* valid, but not an int64 */ };
PyIntParse PyParseInt(absl::string_view s, int base, int64_t* out);

}  // namespace kimi::tokenizer::jinja
