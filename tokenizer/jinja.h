// A Jinja subset, enough for chat templates, rendering to a Prompt (text pieces marked trusted or
// not; see chat_format.h). Environment as HF transformers renders chat templates: trim_blocks and
// lstrip_blocks on, loop controls on, keep_trailing_newline off (one newline at the end of the
// source goes), and \r\n and \r in the source read as \n.
//
// Supported:
//   {{ expr }}, {% if %}/{% elif %}/{% else %}/{% endif %}, {% for x in xs %} and
//   {% for k, v in pairs %} with a filter (`for x in xs if cond`), {% else %} and
//   loop.index/index0/revindex/revindex0/first/last/length/previtem/nextitem,
//   {% set name = expr %}, {% set ns.attr = expr %}, {% break %}, {% continue %},
//   {# comments #}, whitespace control `-` (and `+` to keep lstrip off).
//   Expressions: literals (strings, ints, floats, true/false/none in either case, lists, tuples,
//   dicts), names, `.attr`, `[index]`, `[a:b:step]` slices, `a if c else b`, or/and/not,
//   == != < <= > >= and in / not in (chained as in Python: a < b < c), is [not] TEST,
//   + - * / // %, ~, unary - (filters and tests apply to its result: -1|abs is 1).
//   Tests: defined undefined none string number integer float boolean mapping iterable sequence
//   true false odd even.
//   Filters: tojson(indent=None, separators=(a,b)), length/count (0 for undefined), string,
//   trim(chars), upper, lower, capitalize, title, default/d, first, last, join, list,
//   int(default, base), float(default), items, safe, abs, replace(old, new, count).
//   Functions: raise_exception(msg) (a clean error), namespace(k=v, ...), range(...).
//   Methods: str.startswith/endswith/split/upper/lower/title/capitalize, str.strip/lstrip/rstrip
//   (chars), str.replace(old, new, count), dict.get/items/keys/values, list.append/pop.
//   String literals decode Python's escapes (\n \t \xHH \uHHHH \UHHHHHHHH, octal, ...; not
//   \N{name}). Case mapping and whitespace are Python's as far as jinja_str.h says.
//   Undefined values render as "", are falsy and iterate as empty (Jinja's default Undefined, minus
//   its errors on attribute access).
// Anything else (macro, call, filter blocks, include, import, extends, block, raw, with, set
// blocks, unknown filters/tests/methods) is a clear InvalidArgument error naming the construct and
// the line, at parse time where it can be seen then.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tokenizer/chat_format.h"
#include "tokenizer/jinja_value.h"

namespace kimi::tokenizer::jinja {

struct Node;

class Template {
 public:
  static absl::StatusOr<std::unique_ptr<Template>> Parse(absl::string_view source);
  ~Template();
  // Text from template literals is trusted; text from tainted values is not.
  absl::StatusOr<Prompt> Render(const std::map<std::string, Value>& globals) const;

 private:
  Template();
  std::vector<Node> body_;
};

}  // namespace kimi::tokenizer::jinja
