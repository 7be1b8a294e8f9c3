#include "tokenizer/jinja_value.h"

#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"

namespace kimi::tokenizer::jinja {

const Value* ValueDict::Get(absl::string_view key) const {
  for (const auto& [k, v] : items) {
    if (k == key) return &v;
  }
  return nullptr;
}

void ValueDict::Set(const std::string& key, Value v) {
  for (auto& [k, old] : items) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  items.emplace_back(key, std::move(v));
}

Value Value::None() {
  Value v;
  v.kind = Kind::kNone;
  return v;
}
Value Value::Bool(bool x) {
  Value v;
  v.kind = Kind::kBool;
  v.b = x;
  return v;
}
Value Value::Int(int64_t x) {
  Value v;
  v.kind = Kind::kInt;
  v.i = x;
  return v;
}
Value Value::Float(double x) {
  Value v;
  v.kind = Kind::kFloat;
  v.f = x;
  return v;
}
Value Value::Str(std::string x, bool tainted) {
  Value v;
  v.kind = Kind::kString;
  v.s = std::move(x);
  v.tainted = tainted;
  return v;
}
Value Value::List(ValueList x) {
  Value v;
  v.kind = Kind::kList;
  v.list = std::make_shared<ValueList>(std::move(x));
  return v;
}
Value Value::Dict(ValueDict x) {
  Value v;
  v.kind = Kind::kDict;
  v.dict = std::make_shared<ValueDict>(std::move(x));
  return v;
}

bool Value::Truthy() const {
  switch (kind) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return b;
    case Kind::kInt:
      return i != 0;
    case Kind::kFloat:
      return f != 0;
    case Kind::kString:
      return !s.empty();
    case Kind::kList:
      return !list->empty();
    case Kind::kDict:
      return !dict->items.empty();
  }
  return false;
}

bool Value::DeepTainted() const {
  if (kind == Kind::kString) return tainted;
  if (kind == Kind::kList) {
    for (const Value& v : *list) {
      if (v.DeepTainted()) return true;
    }
  }
  if (kind == Kind::kDict) {
    if (tainted) return true;
    for (const auto& [k, v] : dict->items) {
      if (v.DeepTainted()) return true;
    }
  }
  return false;
}

namespace {

std::string Repr(const Value& v) {
  if (v.kind == Value::Kind::kString) {
    std::string out = "'";
    for (char c : v.s) {
      if (c == '\'' || c == '\\') out.push_back('\\');
      if (c == '\n') {
        out += "\\n";
        continue;
      }
      out.push_back(c);
    }
    return out + "'";
  }
  return ToPythonStr(v);
}

std::string FloatStr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  if (f == std::floor(f) && std::fabs(f) < 1e16) return absl::StrCat(static_cast<int64_t>(f), ".0");
  char buf[32];
  for (int prec = 1; prec <= 17; ++prec) {  // shortest round-trip, as Python's repr
    std::snprintf(buf, sizeof(buf), "%.*g", prec, f);
    if (std::strtod(buf, nullptr) == f) break;
  }
  return buf;
}

}  // namespace

std::string ToPythonStr(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
      return "";
    case Value::Kind::kNone:
      return "None";
    case Value::Kind::kBool:
      return v.b ? "True" : "False";
    case Value::Kind::kInt:
      return absl::StrCat(v.i);
    case Value::Kind::kFloat:
      return FloatStr(v.f);
    case Value::Kind::kString:
      return v.s;
    case Value::Kind::kList: {
      std::string out = "[";
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += ", ";
        out += Repr((*v.list)[k]);
      }
      return out + "]";
    }
    case Value::Kind::kDict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [key, item] : v.dict->items) {
        if (!first) out += ", ";
        first = false;
        out += Repr(Value::Str(key)) + ": " + Repr(item);
      }
      return out + "}";
    }
  }
  return "";
}

bool Equals(const Value& a, const Value& b) {
  auto numeric = [](const Value& v) { return v.is_number() || v.kind == Value::Kind::kBool; };
  if (numeric(a) && numeric(b)) {
    auto as_double = [](const Value& v) {
      return v.kind == Value::Kind::kBool ? (v.b ? 1.0 : 0.0) : v.AsDouble();
    };
    if (a.kind == Value::Kind::kInt && b.kind == Value::Kind::kInt) return a.i == b.i;
    return as_double(a) == as_double(b);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Kind::kString:
      return a.s == b.s;
    case Value::Kind::kList:
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k) {
        if (!Equals((*a.list)[k], (*b.list)[k])) return false;
      }
      return true;
    case Value::Kind::kDict:
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& [k, v] : a.dict->items) {
        const Value* o = b.dict->Get(k);
        if (!o || !Equals(v, *o)) return false;
      }
      return true;
    default:
      return true;  // undefined == undefined, None == None
  }
}

Value FromJson(const nlohmann::ordered_json& j, bool tainted) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::None();
    case nlohmann::ordered_json::value_t::boolean:
      return Value::Bool(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value::Int(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned:
      return Value::Int(static_cast<int64_t>(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float:
      return Value::Float(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value::Str(j.get<std::string>(), tainted);
    case nlohmann::ordered_json::value_t::array: {
      ValueList list;
      for (const auto& x : j) list.push_back(FromJson(x, tainted));
      return Value::List(std::move(list));
    }
    case nlohmann::ordered_json::value_t::object: {
      ValueDict dict;
      for (const auto& [k, x] : j.items()) dict.items.emplace_back(k, FromJson(x, tainted));
      Value v = Value::Dict(std::move(dict));
      v.tainted = tainted;  // the keys are request text as much as the values
      return v;
    }
    default:
      return Value::None();
  }
}

nlohmann::ordered_json ToJson(const Value& v) {
  switch (v.kind) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return nullptr;
    case Value::Kind::kBool:
      return v.b;
    case Value::Kind::kInt:
      return v.i;
    case Value::Kind::kFloat:
      return v.f;
    case Value::Kind::kString:
      return v.s;
    case Value::Kind::kList: {
      auto arr = nlohmann::ordered_json::array();
      for (const Value& x : *v.list) arr.push_back(ToJson(x));
      return arr;
    }
    case Value::Kind::kDict: {
      auto obj = nlohmann::ordered_json::object();
      for (const auto& [k, x] : v.dict->items) obj[k] = ToJson(x);
      return obj;
    }
  }
  return nullptr;
}

int64_t PythonLength(const Value& v) {
  if (v.is_string()) {
    int64_t n = 0;
    for (char c : v.s) n += (static_cast<uint8_t>(c) & 0xC0) != 0x80;
    return n;
  }
  if (v.is_list()) return static_cast<int64_t>(v.list->size());
  if (v.is_dict()) return static_cast<int64_t>(v.dict->items.size());
  return -1;
}

}  // namespace kimi::tokenizer::jinja
