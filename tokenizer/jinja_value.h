// Values of the Jinja subset (see jinja.h): Python-like none/bool/int/float/str/list/dict, plus
// Jinja's undefined. Lists and dicts are shared by reference, as in Python, so `ns.x = ...` and
// `list.append(...)` are seen through every name bound to them. Strings remember whether they came
// from request data (`tainted`), and so do dicts for their keys: such text never becomes special
// tokens.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace kimi::tokenizer::jinja {

struct Value;
using ValueList = std::vector<Value>;
struct ValueDict {
  std::vector<std::pair<std::string, Value>> items;  // insertion order, as Python dicts
  const Value* Get(absl::string_view key) const;
  void Set(const std::string& key, Value v);
};

struct Value {
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict };
  Kind kind = Kind::kUndefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;
  // Text from the request (messages, tools): for a string its text, for a dict its keys (a tool's
  // property names are the request's too, whatever their values are; values carry their own).
  bool tainted = false;
  std::shared_ptr<ValueList> list;
  std::shared_ptr<ValueDict> dict;

  static Value None();
  static Value Bool(bool v);
  static Value Int(int64_t v);
  static Value Float(double v);
  static Value Str(std::string v, bool tainted = false);
  static Value List(ValueList v = {});
  static Value Dict(ValueDict v = {});

  bool is_undefined() const { return kind == Kind::kUndefined; }
  bool is_none() const { return kind == Kind::kNone; }
  bool is_string() const { return kind == Kind::kString; }
  bool is_number() const { return kind == Kind::kInt || kind == Kind::kFloat; }
  bool is_list() const { return kind == Kind::kList; }
  bool is_dict() const { return kind == Kind::kDict; }
  double AsDouble() const { return kind == Kind::kInt ? static_cast<double>(i) : f; }

  bool Truthy() const;
  // True when this value or anything inside it (dict keys included) is tainted text.
  bool DeepTainted() const;
};

// Python's str(): "None", "True", "False", numbers, strings as is, lists and dicts as repr.
std::string ToPythonStr(const Value& v);
// Python ==, with 1 == 1.0 == True.
bool Equals(const Value& a, const Value& b);
// JSON <-> values; undefined becomes null.
Value FromJson(const nlohmann::ordered_json& j, bool tainted);
nlohmann::ordered_json ToJson(const Value& v);
// Length in Python terms: code points of a string, items of a list or dict; -1 otherwise.
int64_t PythonLength(const Value& v);

}  // namespace kimi::tokenizer::jinja
