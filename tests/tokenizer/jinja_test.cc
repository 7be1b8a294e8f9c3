// The Jinja subset: HF's environment (trim_blocks, lstrip_blocks), whitespace control, scoping,
// expressions, filters, and clear errors for what it does not cover.
#include "tokenizer/jinja.h"

#include <gtest/gtest.h>

namespace kimi::tokenizer::jinja {
namespace {

std::map<std::string, Value> Vars() {
  std::map<std::string, Value> v;
  v["name"] = Value::Str("Kimi", /*tainted=*/true);
  v["n"] = Value::Int(3);
  v["items"] = Value::List({Value::Str("a"), Value::Str("b"), Value::Str("c")});
  v["obj"] = FromJson(
      nlohmann::ordered_json::parse(R"({"k": "v", "num": 2.5, "nested": {"x": [1, 2]}})"), true);
  return v;
}

std::string Render(const std::string& src, std::map<std::string, Value> vars = Vars()) {
  auto t = Template::Parse(src);
  if (!t.ok()) return "PARSE ERROR: " + std::string(t.status().message());
  auto p = (*t)->Render(vars);
  if (!p.ok()) return "RENDER ERROR: " + std::string(p.status().message());
  return PromptText(*p);
}

TEST(Jinja, OutputAndWhitespaceControl) {
  EXPECT_EQ(Render("Hello {{ name }}!"), "Hello Kimi!");
  EXPECT_EQ(Render("a  {{- name -}}  b"), "aKimib");
  // trim_blocks removes the newline after a block tag; lstrip_blocks the indent before it.
  EXPECT_EQ(Render("x\n  {% if true %}\n  y\n  {% endif %}\nz"), "x\n  y\nz");
  EXPECT_EQ(Render("x {# note #}\ny"), "x y");
  EXPECT_EQ(Render("{% for i in items %}{{ i }},{% endfor %}"), "a,b,c,");
  EXPECT_EQ(Render("  {%+ if true %}k{% endif %}"), "  k");
}

TEST(Jinja, LoopsAndScopes) {
  EXPECT_EQ(Render("{% for i in items %}{{ loop.index }}{{ i }}{% if not loop.last %}-{% endif %}"
                   "{% endfor %}"),
            "1a-2b-3c");
  EXPECT_EQ(Render("{% for i in items %}{{ loop.index0 }}{{ loop.length }}{{ loop.first }}"
                   "{{ loop.revindex }}|{% endfor %}"),
            "03True3|13False2|23False1|");
  EXPECT_EQ(Render("{% for i in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(Render("{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}"
                   "{% if i == 4 %}{% break %}{% endif %}{{ i }}{% endfor %}"),
            "013");
  // set inside a loop does not leak; namespace attributes do.
  EXPECT_EQ(Render("{% set x = 1 %}{% set ns = namespace(c=0) %}{% for i in items %}{% set x = 5 %}"
                   "{% set ns.c = ns.c + 1 %}{% endfor %}{{ x }}{{ ns.c }}"),
            "13");
  EXPECT_EQ(Render("{% for k, v in obj.items() %}{{ k }}={{ v }};{% endfor %}"),
            "k=v;num=2.5;nested={'x': [1, 2]};");
}

TEST(Jinja, Expressions) {
  EXPECT_EQ(Render("{{ 1 + 2 * 3 }} {{ 7 // 2 }} {{ 7 % 3 }} {{ -n }} {{ 'a' ~ 1 ~ none }}"),
            "7 3 1 -3 a1None");
  EXPECT_EQ(Render("{{ 'yes' if n > 2 else 'no' }} {{ 'x' if false }}"), "yes ");
  EXPECT_EQ(
      Render("{{ 'b' in items }} {{ 'z' not in items }} {{ 'im' in 'Kimi' }} {{ 'k' in obj }}"),
      "True True True True");
  EXPECT_EQ(Render("{{ obj.nested.x[1] }} {{ obj['k'] }} {{ items[-1] }} {{ items[1:] }} "
                   "{{ name[1:3] }} {{ obj.missing }}|"),
            "2 v c ['b', 'c'] im |");
  EXPECT_EQ(Render("{{ obj.get('k') }} {{ obj.get('zz', 'dflt') }} {{ name.startswith('Ki') }} "
                   "{{ ' x '.strip() }} {{ 'a,b'.split(',') }} {{ name.upper() }}"),
            "v dflt True x ['a', 'b'] KIMI");
  EXPECT_EQ(Render("{{ undefined_thing is defined }} {{ none is none }} {{ name is string }} "
                   "{{ obj is mapping }} {{ n is not number }} {{ 3 is odd }}"),
            "False True True True False True");
  EXPECT_EQ(Render("{% set l = [] %}{% set _ = l.append(1) %}{% set _ = l.append(2) %}"
                   "{{ l.pop(0) }}{{ l }}"),
            "1[2]");
}

TEST(Jinja, Filters) {
  EXPECT_EQ(Render("{{ obj | tojson }}"), R"({"k": "v", "num": 2.5, "nested": {"x": [1, 2]}})");
  EXPECT_EQ(Render("{{ obj | tojson(separators=(',', ':')) }}"),
            R"({"k":"v","num":2.5,"nested":{"x":[1,2]}})");
  EXPECT_EQ(Render("{{ items | length }} {{ name | length }} {{ items | join('+') }} "
                   "{{ items | first }}{{ items | last }} {{ '  t ' | trim }} {{ 5 | string }}"),
            "3 4 a+b+c ac t 5");
  EXPECT_EQ(Render("{{ missing | default('d') }} {{ '' | default('e', true) }} {{ name | lower }}"),
            "d e kimi");
  EXPECT_EQ(Render(R"({{ "quote\"\n" | tojson }})"), R"("quote\"\n")");
}

// jinja2 (keep_trailing_newline off) drops one newline at the end of the source and reads \r\n
// and \r as \n, in text and string literals alike.
TEST(Jinja, SourceNewlinesAsJinja2) {
  EXPECT_EQ(Render("a\n"), "a");
  EXPECT_EQ(Render("a\n\n"), "a\n");
  EXPECT_EQ(Render("a\r\nb\rc\r\n"), "a\nb\nc");
  EXPECT_EQ(Render("{% if true %}x{% endif %}\n\n"), "x");
  EXPECT_EQ(Render("{{ 'a\r\nb' }}"), "a\nb");
  EXPECT_EQ(Render("x\r\n  {% if true %}\r\ny{% endif %}\r\n"), "x\ny");
  EXPECT_EQ(Render("\n"), "");
  EXPECT_NE(Render("l1\r\nl2\r{% if %}").find("line 3"), std::string::npos);
}

// Filters and tests apply after unary minus; comparisons chain; undefined has length 0.
TEST(Jinja, OperatorsAsJinja2) {
  EXPECT_EQ(Render("{{ -1|abs }} {{ -n|abs }} {{ -n is odd }} {{ - -2|abs }} {{ -obj.num }}"),
            "1 3 True 2 -2.5");
  EXPECT_EQ(Render("{{ 2 * -1|abs }} {{ -n|string }}"), "2 -3");
  EXPECT_EQ(Render("{{ missing|length }} {% if tools|length > 0 %}t{% else %}none{% endif %}"),
            "0 none");
  EXPECT_EQ(Render("{{ 2 == 2 == 2 }} {{ 1 < 2 < 3 }} {{ 3 > 2 < 1 }} {{ 1 < n <= 3 }} "
                   "{{ 'a' in items == true }} {{ 1 == 1 != 2 }}"),
            "True True False True False True");  // 'a' in items and items == true
  // The chain stops at the first false link, like Python: the bad comparison is never made.
  EXPECT_EQ(Render("{{ 2 < 1 < 'x' }}"), "False");
}

// str.replace and the replace filter take a count; string literals decode Python's escapes.
TEST(Jinja, ReplaceCountAndLiteralEscapes) {
  EXPECT_EQ(
      Render(
          R"({{ 'aaa'.replace('a', 'b', 2) }} {{ 'aaa'|replace('a', 'b', 2) }} {{ 'aaa'|replace('a', 'b') }} {{ 'aaa'.replace('a', 'b', 0) }} {{ 'aaa'.replace('a', 'b', -1) }})"),
      "bba bba bbb aaa bbb");
  EXPECT_EQ(
      Render(
          R"({{ 'ab'.replace('', '-') }} {{ 'ab'|replace('', '-', 2) }} {{ 125|replace(2, 9) }} {{ 'aXa'|replace('a', 'é', count=1) }})"),
      "-a-b- -a-b 195 éXa");
  EXPECT_EQ(Render(R"({{ '\u00e9\x41\U0001F600|\t|\\|\'|\"|\101|\q|\a|\x7e' }})"),
            "éA😀|\t|\\|'|\"|A|\\q|\007|~");
  EXPECT_EQ(Render(R"({{ "\u00E9t\u00e9" ~ '\n' }})"), "été\n");
  // An escape that Python rejects is a parse error, not text.
  EXPECT_NE(Render(R"({{ '\x4' }})").find("truncated \\x escape"), std::string::npos);
  EXPECT_NE(Render(R"({{ '\ud800' }})").find("not a Unicode scalar value"), std::string::npos);
}

// Case mapping is Python's beyond ASCII (Latin-1, Latin Extended-A, Greek, Cyrillic; ß upper is SS,
// a final capital sigma lowers to ς); the title filter is jinja2's (words split at whitespace and
// -({[<), str.title() Python's; strip and trim take Unicode whitespace or a set of characters.
TEST(Jinja, StringCaseAndStripAsPython) {
  EXPECT_EQ(
      Render(
          R"({{ 'éàß'|upper }} {{ 'ÉΣ'|lower }} {{ 'ΟΔΟΣ ΟΔΟΣ.'|lower }} {{ 'ΣΑ'|lower }} {{ 'привет МИР'|upper }} {{ 'ĳssel ŉ'|upper }} {{ 'İ'|lower|length }})"),
      "ÉÀSS éς οδος οδος. σα ПРИВЕТ МИР ĲSSEL ʼN 2");
  EXPECT_EQ(
      Render(
          R"({{ 'héllo wörld-ñu (ça)'|title }} {{ "they're bill's"|title }} {{ 'éCOLE'|capitalize }} {{ 'ßa'|capitalize }})"),
      "Héllo Wörld-Ñu (Ça) They're Bill's École Ssa");
  EXPECT_EQ(
      Render(
          R"({{ 'élan vital'.title() }} {{ "they're".title() }} {{ 'ÀB'.lower() }} {{ 'àb'.upper() }} {{ 'àB'.capitalize() }})"),
      "Élan Vital They'Re àb ÀB Àb");
  EXPECT_EQ(
      Render(
          R"({{ '\u3000x\xa0'|trim }}|{{ '\u2003 x\u2028'.strip() }}|{{ '\xa0x '.lstrip() }}|{{ ' x\xa0'.rstrip() }}|{{ 'xxhixy'.strip('xy') }}|{{ '--a--'.lstrip('-') }}|{{ '--a--'.rstrip('-') }}|{{ '««a»»'.strip('«»') }}|{{ 'xax'|trim('x') }}|{{ ' a '.strip(none) }}|)"),
      "x|x|x | x|hi|a--|--a|a|a|a|");
}

// int and float as jinja2: Python's int(str, base), else int(float(str)), else the default; no
// prefix of a string counts; bools are numbers.
TEST(Jinja, IntAndFloatFiltersAsJinja2) {
  EXPECT_EQ(
      Render(
          R"({{ 'x'|int(5) }} {{ true|int }} {{ false|int }} {{ '12abc'|int }} {{ ' 12 '|int }} {{ '1_000'|int }} {{ '0x1A'|int }} {{ '3.7'|int }} {{ '-3.7'|int }} {{ '+4'|int }} {{ none|int }} {{ 3.9|int }} {{ -3.9|int }} {{ items|int }} {{ ''|int(7) }} {{ '1e3'|int }} {{ 'nan'|int(2) }} {{ '- 1'|int }} {{ 'x'|int('y') }} {{ 'x'|int(default=-1) }})"),
      "5 1 0 0 12 1000 0 3 -3 4 0 3 -3 0 7 1000 2 0 y -1");
  EXPECT_EQ(
      Render(
          R"({{ '1A'|int(base=16) }} {{ '0x1A'|int(0, 16) }} {{ '0x_1a'|int(0, 0) }} {{ '012'|int(0, 0) }} {{ '00'|int(9, 0) }} {{ 'z'|int(0, 36) }} {{ '1__0'|int }} {{ '_1'|int }} {{ '1_'|int }} {{ '-9223372036854775808'|int }})"),
      "26 26 26 12 0 35 0 0 0 -9223372036854775808");
  EXPECT_EQ(
      Render(
          R"({{ 'x'|float(1.5) }} {{ '12abc'|float }} {{ '1e3'|float }} {{ true|float }} {{ none|float }} {{ ' -2.5 '|float }} {{ '1_0.5'|float }} {{ 'inf'|float }} {{ '-Infinity'|float }} {{ 'NaN'|float }} {{ '.5'|float }} {{ '5.'|float }} {{ 3|float }} {{ 'x'|float(none) }} {{ '1e'|float }} {{ '0x10'|float }} {{ '1.5e-3'|float }} {{ '1_e5'|float }})"),
      "1.5 0.0 1000.0 1.0 0.0 -2.5 10.5 inf -inf nan 0.5 5.0 3.0 None 0.0 0.0 0.0015 0.0");
  // What Python would make a big int or an infinity does not pass silently.
  EXPECT_NE(Render("{{ '99999999999999999999'|int }}").find("64 bits"), std::string::npos);
  EXPECT_NE(Render("{{ 'inf'|int }}").find("64 bits"), std::string::npos);
  EXPECT_NE(Render("{{ missing|int }}").find("undefined"), std::string::npos);
}

// Slices take a step as Python's do; a loop's `if` filters before looping, so loop.index,
// loop.length and {% else %} count the kept items only.
TEST(Jinja, SliceStepAndLoopFilter) {
  EXPECT_EQ(
      Render(
          R"({{ items[::-1] }} {{ name[::-1] }} {{ items[:: -1] }} {{ items[::2] }} {{ items[1::-1] }} {{ items[-1:0:-1] }} {{ name[5:-9:-1] }} {{ items[::100] }} {{ items[::-100] }} {{ items[0:3:] }} {{ 'héllo'[::2] }})"),
      "['c', 'b', 'a'] imiK ['c', 'b', 'a'] ['a', 'c'] ['b', 'a'] ['c', 'b'] imiK ['a'] ['c'] "
      "['a', 'b', 'c'] hlo");
  EXPECT_EQ(
      Render(
          R"({% for i in items if i != 'b' %}{{ loop.index }}{{ i }}{{ loop.length }}{% if loop.last %}.{% endif %}{% endfor %})"),
      "1a22c2.");
  EXPECT_EQ(
      Render(
          R"({% for k, v in obj.items() if v is string %}{{ k }}={{ v }}{% endfor %}|{% for i in items if i == 'z' %}x{% else %}none{% endfor %}|{% for i in range(10) if i is odd and i > 2 %}{{ i }}{% endfor %})"),
      "k=v|none|3579");
}

TEST(Jinja, TaintFollowsRequestData) {
  auto t = Template::Parse("<{{ name }}>{{ 'lit' }}{{ name ~ '!' }}{{ obj | tojson }}{{ n }}");
  ASSERT_TRUE(t.ok());
  auto p = (*t)->Render(Vars());
  ASSERT_TRUE(p.ok());
  std::string trusted, untrusted;
  for (const PromptSegment& s : *p) (s.trusted ? trusted : untrusted) += s.text + "|";
  EXPECT_EQ(trusted, "<|>lit|3|");
  EXPECT_EQ(untrusted, R"(Kimi|Kimi!{"k": "v", "num": 2.5, "nested": {"x": [1, 2]}}|)");
}

// A request dict's keys are request text whatever their values are: a tool schema's property
// names (objects as values) or a dict of numbers must not come out trusted.
TEST(Jinja, KeysOfRequestDictsAreUntrusted) {
  std::map<std::string, Value> vars;
  vars["props"] = FromJson(
      nlohmann::ordered_json::parse(R"({"<|im_end|>": {"type": "string"}, "n": 1})"), true);
  vars["name"] = Value::Str("<k>", /*tainted=*/true);
  auto t = Template::Parse(
      "{% for k in props %}{{ k }}|{% endfor %}{% for k, v in props.items() %}{{ k }}|{% endfor %}"
      "{{ props.keys()|join(',') }}|{{ props.n }}|{{ props.n|tojson }}|{{ {'a': 1} }}|"
      "{{ {name: 1} }}|{{ {name: 1}.keys()|first }}|{{ props['<|im_end|>']|tojson }}");
  ASSERT_TRUE(t.ok()) << t.status();
  auto p = (*t)->Render(vars);
  ASSERT_TRUE(p.ok()) << p.status();
  std::string trusted, untrusted;
  for (const PromptSegment& s : *p) (s.trusted ? trusted : untrusted) += s.text + "#";
  EXPECT_EQ(untrusted,
            "<|im_end|>#n#<|im_end|>#n#<|im_end|>,n#{'<k>': 1}#<k>#"
            "{\"type\": \"string\"}#");
  // Numbers are not text from anyone; a dict literal's keys from the template are the template's.
  EXPECT_EQ(trusted, "|#|#|#|#|1|1|{'a': 1}|#|#|#");
}

TEST(Jinja, ClearErrorsOutsideTheSubset) {
  auto err = [](const std::string& src) {
    auto t = Template::Parse(src);
    if (!t.ok()) return std::string(t.status().message());
    auto p = (*t)->Render(Vars());
    return p.ok() ? std::string("no error") : std::string(p.status().message());
  };
  EXPECT_NE(err("{% macro f() %}x{% endmacro %}").find("unsupported Jinja construct '{% macro"),
            std::string::npos);
  EXPECT_NE(err("{% include 'x' %}").find("include"), std::string::npos);
  EXPECT_NE(err("{{ x | wordcount }}").find("unsupported Jinja filter 'wordcount'"),
            std::string::npos);
  EXPECT_NE(err("{{ x is divisibleby(3) }}").find("unsupported Jinja test"), std::string::npos);
  EXPECT_NE(err("{{ cycler() }}").find("unsupported Jinja function 'cycler'"), std::string::npos);
  EXPECT_NE(err("line1\n{% if true %}").find("line 2"), std::string::npos);
  EXPECT_NE(err("{{ 'unterminated }}").find("unterminated"), std::string::npos);
  EXPECT_NE(err("{{ raise_exception('Only user and assistant roles') }}")
                .find("the template raised: Only user and assistant roles"),
            std::string::npos);
  EXPECT_NE(err("{% for i in items recursive %}{% endfor %}").find("unsupported"),
            std::string::npos);
  EXPECT_NE(err("{% for i in range(100000000) %}{% endfor %}").find("too long"), std::string::npos);
  EXPECT_NE(err("{{ " + std::string(500, '(') + "1" + std::string(500, ')') + " }}").find("deeply"),
            std::string::npos);
  EXPECT_NE(err("{{ 1 / 0 }}").find("division by zero"), std::string::npos);
  EXPECT_NE(err("{{ items[::0] }}").find("slice step cannot be zero"), std::string::npos);
  // A string doubled 40 times in a few dozen steps asked for 1 TiB (bad_alloc).
  EXPECT_NE(err("{% set ns = namespace(s='x') %}{% for i in range(40) %}"
                "{% set ns.s = ns.s ~ ns.s %}{% endfor %}")
                .find("grows past 64 MiB"),
            std::string::npos);
}

}  // namespace
}  // namespace kimi::tokenizer::jinja
