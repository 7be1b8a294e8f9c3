#include "tokenizer/jinja_str.h"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <vector>

#include "tokenizer/utf8.h"

namespace kimi::tokenizer::jinja {
namespace {

// A byte that is not UTF-8 travels as kRawByte | byte and is written back as that byte: request
// text is UTF-8, but a template's own bytes are not checked, and nothing here should lose them.
constexpr uint32_t kRawByte = 0x80000000u;

std::vector<uint32_t> Decode(absl::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    uint32_t cp;
    const size_t n = DecodeUtf8(s, i, &cp);
    if (n == 0) {
      out.push_back(kRawByte | static_cast<uint8_t>(s[i]));
      ++i;
    } else {
      out.push_back(cp);
      i += n;
    }
  }
  return out;
}

void Append(uint32_t cp, std::string* out) {
  if (cp & kRawByte) {
    out->push_back(static_cast<char>(cp & 0xFF));
  } else {
    AppendUtf8(cp, out);
  }
}

bool Even(uint32_t c) { return c % 2 == 0; }

// Python's one-to-one lower case of c, within the blocks jinja_str.h names; c itself elsewhere.
uint32_t SimpleLower(uint32_t c) {
  if (c < 0x80) return c >= 'A' && c <= 'Z' ? c + 32 : c;
  if (c < 0x100) return c >= 0xC0 && c <= 0xDE && c != 0xD7 ? c + 32 : c;
  if (c < 0x180) {
    if ((c <= 0x12F || (c >= 0x132 && c <= 0x137) || (c >= 0x14A && c <= 0x177)) && Even(c))
      return c + 1;
    if (((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) && !Even(c)) return c + 1;
    if (c == 0x178) return 0xFF;
    return c;
  }
  if (c >= 0x370 && c < 0x400) {
    if (c == 0x370 || c == 0x372 || c == 0x376) return c + 1;
    if (c == 0x37F) return 0x3F3;
    if (c == 0x386) return 0x3AC;
    if (c >= 0x388 && c <= 0x38A) return c + 37;
    if (c == 0x38C) return 0x3CC;
    if (c == 0x38E || c == 0x38F) return c + 63;
    if ((c >= 0x391 && c <= 0x3A1) || (c >= 0x3A3 && c <= 0x3AB)) return c + 32;
    if (c == 0x3CF) return 0x3D7;
    if (c >= 0x3D8 && c <= 0x3EF && Even(c)) return c + 1;
    if (c == 0x3F4) return 0x3B8;
    if (c == 0x3F7 || c == 0x3FA) return c + 1;
    if (c == 0x3F9) return 0x3F2;
    if (c >= 0x3FD) return c - 130;
    return c;
  }
  if (c >= 0x400 && c < 0x530) {
    if (c <= 0x40F) return c + 80;
    if (c >= 0x410 && c <= 0x42F) return c + 32;
    if (((c >= 0x460 && c <= 0x481) || (c >= 0x48A && c <= 0x4BF) || c >= 0x4D0) && Even(c))
      return c + 1;
    if (c == 0x4C0) return 0x4CF;
    if (c >= 0x4C1 && c <= 0x4CE && !Even(c)) return c + 1;
    return c;
  }
  return c;
}

// Python's one-to-one upper case of c, within the same blocks.
uint32_t SimpleUpper(uint32_t c) {
  if (c < 0x80) return c >= 'a' && c <= 'z' ? c - 32 : c;
  if (c < 0x100) {
    if (c == 0xB5) return 0x39C;
    if (c == 0xFF) return 0x178;
    return c >= 0xE0 && c <= 0xFE && c != 0xF7 ? c - 32 : c;
  }
  if (c < 0x180) {
    if ((c <= 0x12F || (c >= 0x132 && c <= 0x137) || (c >= 0x14A && c <= 0x177)) && !Even(c))
      return c - 1;
    if (((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) && Even(c)) return c - 1;
    if (c == 0x131) return 'I';
    if (c == 0x17F) return 'S';
    return c;
  }
  if (c == 0x345) return 0x399;  // combining ypogegrammeni
  if (c >= 0x370 && c < 0x400) {
    if (c == 0x371 || c == 0x373 || c == 0x377) return c - 1;
    if (c >= 0x37B && c <= 0x37D) return c + 130;
    if (c == 0x3AC) return 0x386;
    if (c >= 0x3AD && c <= 0x3AF) return c - 37;
    if ((c >= 0x3B1 && c <= 0x3C1) || (c >= 0x3C3 && c <= 0x3CB)) return c - 32;
    if (c == 0x3C2) return 0x3A3;
    if (c == 0x3CC) return 0x38C;
    if (c == 0x3CD || c == 0x3CE) return c - 63;
    // Greek symbol variants upper to the plain capitals.
    switch (c) {
      case 0x3D0:
        return 0x392;
      case 0x3D1:
        return 0x398;
      case 0x3D5:
        return 0x3A6;
      case 0x3D6:
        return 0x3A0;
      case 0x3D7:
        return 0x3CF;
      case 0x3F0:
        return 0x39A;
      case 0x3F1:
        return 0x3A1;
      case 0x3F2:
        return 0x3F9;
      case 0x3F3:
        return 0x37F;
      case 0x3F5:
        return 0x395;
      case 0x3F8:
      case 0x3FB:
        return c - 1;
      default:
        break;
    }
    if (c >= 0x3D8 && c <= 0x3EF && !Even(c)) return c - 1;
    return c;
  }
  if (c >= 0x400 && c < 0x530) {
    if (c >= 0x430 && c <= 0x44F) return c - 32;
    if (c >= 0x450 && c <= 0x45F) return c - 80;
    if (((c >= 0x460 && c <= 0x481) || (c >= 0x48A && c <= 0x4BF) || c >= 0x4D0) && !Even(c))
      return c - 1;
    if (c == 0x4CF) return 0x4C0;
    if (c >= 0x4C1 && c <= 0x4CE && Even(c)) return c - 1;
    return c;
  }
  return c;
}

// Python's "cased" (Lu, Ll, Lt and Other_Lowercase/Uppercase) within the table's blocks.
bool IsCased(uint32_t c) {
  if (SimpleLower(c) != c || SimpleUpper(c) != c) return true;
  return c == 0xAA || c == 0xBA || c == 0xDF || c == 0x130 || c == 0x138 || c == 0x149 ||
         c == 0x390 || c == 0x37A || c == 0x3B0 || (c >= 0x3D2 && c <= 0x3D4) || c == 0x3FC;
}

// Python's "case-ignorable", as far as the final-sigma rule needs it: apostrophes and the other
// word-internal punctuation, modifier letters and combining marks.
bool IsCaseIgnorable(uint32_t c) {
  switch (c) {
    case '\'':
    case '.':
    case ':':
    case '^':
    case '`':
    case 0xA8:
    case 0xAD:
    case 0xAF:
    case 0xB4:
    case 0xB7:
    case 0xB8:
    case 0x374:
    case 0x375:
    case 0x37A:
    case 0x384:
    case 0x385:
    case 0x387:
    case 0x2018:
    case 0x2019:
    case 0x2024:
    case 0x2027:
      return true;
    default:
      break;
  }
  return (c >= 0x2B0 && c <= 0x36F) || (c >= 0x483 && c <= 0x489) || (c >= 0x200B && c <= 0x200F);
}

void AppendUpper(uint32_t c, std::string* out) {
  switch (c) {
    case 0xDF:  // ß
      *out += "SS";
      return;
    case 0x149:  // ŉ
      *out += "\u02BCN";
      return;
    case 0x390:  // ΐ
      *out += "\u0399\u0308\u0301";
      return;
    case 0x3B0:  // ΰ
      *out += "\u03A5\u0308\u0301";
      return;
    default:
      Append(SimpleUpper(c), out);
  }
}

void AppendTitle(uint32_t c, std::string* out) {
  if (c == 0xDF) {
    *out += "Ss";
    return;
  }
  AppendUpper(c, out);
}

// Lower case of cps[i], with Python's final-sigma rule: a capital sigma after a cased letter and
// not before one (case-ignorable code points between do not count) is ς.
void AppendLower(const std::vector<uint32_t>& cps, size_t i, std::string* out) {
  const uint32_t c = cps[i];
  if (c == 0x130) {  // İ
    *out += "i\u0307";
    return;
  }
  if (c != 0x3A3) {
    Append(SimpleLower(c), out);
    return;
  }
  size_t j = i;
  while (j > 0 && IsCaseIgnorable(cps[j - 1])) --j;
  bool final_sigma = j > 0 && IsCased(cps[j - 1]);
  if (final_sigma) {
    size_t k = i + 1;
    while (k < cps.size() && IsCaseIgnorable(cps[k])) ++k;
    final_sigma = k == cps.size() || !IsCased(cps[k]);
  }
  AppendUtf8(final_sigma ? 0x3C2 : 0x3C3, out);
}

bool IsJinjaWordBreak(uint32_t c) {
  return IsPythonSpace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
}

bool IsDigitOf(char c, int base, int* value) {
  int v = 99;
  if (c >= '0' && c <= '9') v = c - '0';
  if (c >= 'a' && c <= 'z') v = c - 'a' + 10;
  if (c >= 'A' && c <= 'Z') v = c - 'A' + 10;
  if (v >= base) return false;
  *value = v;
  return true;
}

// Decimal digits with single underscores between them, from s[*i]; false if there are none or an
// underscore is not between two digits.
bool ScanDecimal(absl::string_view s, size_t* i) {
  const size_t start = *i;
  while (*i < s.size()) {
    if (s[*i] >= '0' && s[*i] <= '9') {
      ++*i;
    } else if (s[*i] == '_' && *i > start && *i + 1 < s.size() && s[*i + 1] >= '0' &&
               s[*i + 1] <= '9') {
      ++*i;
    } else {
      break;
    }
  }
  return *i > start;
}

}  // namespace

bool PyParseFloat(absl::string_view text, double* out) {
  const std::string stripped = PyStrip(text, nullptr, true, true);
  absl::string_view s = stripped;
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
  std::string word(s.substr(i));
  for (char& c : word) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c);
  if (word == "inf" || word == "infinity" || word == "nan") {
    const double v = word == "nan" ? std::numeric_limits<double>::quiet_NaN()
                                   : std::numeric_limits<double>::infinity();
    *out = s[0] == '-' ? -v : v;
    return true;
  }
  const bool int_part = ScanDecimal(s, &i);
  bool frac_part = false;
  if (i < s.size() && s[i] == '.') {
    ++i;
    frac_part = ScanDecimal(s, &i);
  }
  if (!int_part && !frac_part) return false;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    if (!ScanDecimal(s, &i)) return false;
  }
  if (i != s.size()) return false;
  std::string digits;
  for (char c : s) {
    if (c != '_') digits += c;
  }
  *out = std::strtod(digits.c_str(), nullptr);  // out of range is inf or 0, as in Python
  return true;
}

PyIntParse PyParseInt(absl::string_view text, int base, int64_t* out) {
  const std::string stripped = PyStrip(text, nullptr, true, true);
  absl::string_view s = stripped;
  size_t i = 0;
  bool negative = false;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) negative = s[i++] == '-';
  bool after_prefix = false;
  if (i + 1 < s.size() && s[i] == '0') {
    const char p = static_cast<char>(s[i + 1] | 0x20);
    const int prefixed = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
    if (prefixed && (base == 0 || base == prefixed)) {
      base = prefixed;
      i += 2;
      after_prefix = true;
    }
  }
  if (base != 0 && (base < 2 || base > 36)) return PyIntParse::kInvalid;
  const bool decimal_of_base0 = base == 0;
  if (base == 0) base = 10;
  uint64_t magnitude = 0;
  bool out_of_range = false, any = false, leading_zero = false;
  for (; i < s.size(); ++i) {
    int d;
    if (s[i] == '_' && (any || after_prefix) && i + 1 < s.size() && s[i + 1] != '_') continue;
    if (!IsDigitOf(s[i], base, &d)) return PyIntParse::kInvalid;
    if (!any) leading_zero = d == 0;
    // Base 0 takes 0, 00, ... but not 012 (Python 3 has no octal without 0o).
    if (decimal_of_base0 && leading_zero && d != 0) return PyIntParse::kInvalid;
    any = true;
    if (magnitude > (uint64_t{1} << 63) / static_cast<uint64_t>(base)) out_of_range = true;
    magnitude = magnitude * static_cast<uint64_t>(base) + static_cast<uint64_t>(d);
    if (magnitude > (uint64_t{1} << 63)) out_of_range = true;
  }
  if (!any) return PyIntParse::kInvalid;
  if (out_of_range || (!negative && magnitude == (uint64_t{1} << 63))) {
    return PyIntParse::kOutOfRange;
  }
  *out = negative ? static_cast<int64_t>(0 - magnitude) : static_cast<int64_t>(magnitude);
  return PyIntParse::kOk;
}

std::string PyUpper(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (uint32_t c : Decode(s)) AppendUpper(c, &out);
  return out;
}

std::string PyLower(absl::string_view s) {
  const std::vector<uint32_t> cps = Decode(s);
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < cps.size(); ++i) AppendLower(cps, i, &out);
  return out;
}

std::string PyCapitalize(absl::string_view s) {
  const std::vector<uint32_t> cps = Decode(s);
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < cps.size(); ++i) {
    if (i == 0) {
      AppendTitle(cps[i], &out);
    } else {
      AppendLower(cps, i, &out);
    }
  }
  return out;
}

std::string PyTitle(absl::string_view s) {
  const std::vector<uint32_t> cps = Decode(s);
  std::string out;
  out.reserve(s.size());
  bool previous_cased = false;
  for (size_t i = 0; i < cps.size(); ++i) {
    if (previous_cased) {
      AppendLower(cps, i, &out);
    } else {
      AppendTitle(cps[i], &out);
    }
    previous_cased = IsCased(cps[i]);
  }
  return out;
}

std::string JinjaTitle(absl::string_view s) {
  const std::vector<uint32_t> cps = Decode(s);
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < cps.size();) {
    // One item of jinja2's re.split: a run of breaks or a run of the rest; each is item[0].upper()
    // + item[1:].lower(), the lower case seeing only item[1:] (as the final-sigma rule does there).
    const bool is_break = IsJinjaWordBreak(cps[i]);
    size_t j = i + 1;
    while (j < cps.size() && IsJinjaWordBreak(cps[j]) == is_break) ++j;
    AppendUpper(cps[i], &out);
    const std::vector<uint32_t> rest(cps.begin() + static_cast<ptrdiff_t>(i) + 1,
                                     cps.begin() + static_cast<ptrdiff_t>(j));
    for (size_t k = 0; k < rest.size(); ++k) AppendLower(rest, k, &out);
    i = j;
  }
  return out;
}

std::string PyStrip(absl::string_view s, const std::string* chars, bool left, bool right) {
  const std::vector<uint32_t> cps = Decode(s);
  std::vector<uint32_t> set;
  if (chars) set = Decode(*chars);
  auto strips = [&](uint32_t c) {
    if (!chars) return !(c & kRawByte) && IsPythonSpace(c);
    return std::find(set.begin(), set.end(), c) != set.end();
  };
  size_t b = 0, e = cps.size();
  if (left) {
    while (b < e && strips(cps[b])) ++b;
  }
  if (right) {
    while (e > b && strips(cps[e - 1])) --e;
  }
  std::string out;
  for (size_t i = b; i < e; ++i) Append(cps[i], &out);
  return out;
}

std::string PyReplace(absl::string_view s, absl::string_view old, absl::string_view repl,
                      int64_t count) {
  std::string out;
  if (old.empty()) {
    // Python puts `repl` before every code point and at the end, `count` times at most.
    size_t i = 0;
    while (true) {
      if (count != 0) {
        out.append(repl.data(), repl.size());
        if (count > 0) --count;
      }
      if (i >= s.size()) break;
      uint32_t cp;
      const size_t n = std::max<size_t>(1, DecodeUtf8(s, i, &cp));
      out.append(s.data() + i, n);
      i += n;
    }
    return out;
  }
  size_t pos = 0;
  while (count != 0) {
    const size_t hit = s.find(old, pos);
    if (hit == absl::string_view::npos) break;
    out.append(s.data() + pos, hit - pos);
    out.append(repl.data(), repl.size());
    pos = hit + old.size();
    if (count > 0) --count;
  }
  out.append(s.data() + pos, s.size() - pos);
  return out;
}

}  // namespace kimi::tokenizer::jinja
