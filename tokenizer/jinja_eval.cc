// Evaluator of the Jinja subset: walks the statement tree, writes trusted/untrusted text pieces.
#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "tokenizer/jinja.h"
#include "tokenizer/jinja_ast.h"
#include "tokenizer/jinja_str.h"

namespace kimi::tokenizer::jinja {
namespace {

constexpr size_t kMaxOutputBytes = 64 << 20;
constexpr int64_t kMaxSteps = 1'000'000;  // loop iterations + nodes: bounds any template's time
constexpr int kMaxCallDepth = 200;

Value TaintedStr(std::string s, bool tainted) { return Value::Str(std::move(s), tainted); }

class Renderer {
 public:
  Renderer(const std::map<std::string, Value>& globals, Prompt* out) : out_(out) {
    scopes_.emplace_back(globals.begin(), globals.end());
  }

  absl::Status Run(const std::vector<Node>& body) {
    Exec(body);
    return status_;
  }

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  // ---- statements ----
  Flow Exec(const std::vector<Node>& nodes) {
    for (const Node& n : nodes) {
      if (!status_.ok() || !Step(n.line)) return Flow::kNormal;
      switch (n.kind) {
        case Node::Kind::kText:
          Emit(n.text, /*trusted=*/true);
          break;
        case Node::Kind::kOutput: {
          const Value v = Eval(*n.expr);
          if (!v.is_undefined()) Emit(ToPythonStr(v), !v.DeepTainted());
          break;
        }
        case Node::Kind::kIf: {
          bool taken = false;
          for (const auto& [cond, body] : n.branches) {
            if (Eval(*cond).Truthy()) {
              taken = true;
              const Flow f = Exec(body);
              if (f != Flow::kNormal) return f;
              break;
            }
          }
          if (!taken) {
            const Flow f = Exec(n.else_body);
            if (f != Flow::kNormal) return f;
          }
          break;
        }
        case Node::Kind::kFor:
          For(n);
          break;
        case Node::Kind::kSet:
          Set(n);
          break;
        case Node::Kind::kBreak:
          return Flow::kBreak;
        case Node::Kind::kContinue:
          return Flow::kContinue;
      }
    }
    return Flow::kNormal;
  }

  void For(const Node& n) {
    const Value seq = Eval(*n.expr);
    ValueList items;
    if (seq.is_list()) {
      items = *seq.list;
    } else if (seq.is_dict()) {
      // A key is as tainted as its dict, whatever its value (a number or a dict says nothing).
      for (const auto& [k, v] : seq.dict->items) items.push_back(Value::Str(k, seq.tainted));
    } else if (seq.is_string()) {
      for (absl::string_view ch : Chars(seq.s))
        items.push_back(Value::Str(std::string(ch), seq.tainted));
    } else if (!seq.is_undefined() && !seq.is_none()) {
      Fail(n.line, absl::StrCat("cannot iterate over ", ToPythonStr(seq)));
      return;
    }
    if (n.filter) {
      // jinja2 filters before looping: loop.index, loop.length and {% else %} see the kept items.
      ValueList kept;
      scopes_.emplace_back();
      for (const Value& item : items) {
        if (!Step(n.line) || !Bind(n, item)) break;
        if (Eval(*n.filter).Truthy()) kept.push_back(item);
        if (!status_.ok()) break;
      }
      scopes_.pop_back();
      if (!status_.ok()) return;
      items = std::move(kept);
    }
    if (items.empty()) {
      Exec(n.else_body);
      return;
    }
    scopes_.emplace_back();
    const int64_t len = static_cast<int64_t>(items.size());
    for (int64_t k = 0; k < len && status_.ok(); ++k) {
      if (!Step(n.line) || !Bind(n, items[k])) break;
      ValueDict loop;
      loop.Set("index", Value::Int(k + 1));
      loop.Set("index0", Value::Int(k));
      loop.Set("revindex", Value::Int(len - k));
      loop.Set("revindex0", Value::Int(len - k - 1));
      loop.Set("first", Value::Bool(k == 0));
      loop.Set("last", Value::Bool(k == len - 1));
      loop.Set("length", Value::Int(len));
      loop.Set("previtem", k > 0 ? items[k - 1] : Value());
      loop.Set("nextitem", k + 1 < len ? items[k + 1] : Value());
      scopes_.back()["loop"] = Value::Dict(std::move(loop));
      if (Exec(n.body) == Flow::kBreak) break;
    }
    scopes_.pop_back();
  }

  // Binds a loop item to the loop's names in the innermost scope.
  bool Bind(const Node& n, const Value& item) {
    auto& scope = scopes_.back();
    if (n.vars.size() == 1) {
      scope[n.vars[0]] = item;
      return true;
    }
    if (!item.is_list() || item.list->size() != 2) {
      Fail(n.line, "cannot unpack a loop item into two names");
      return false;
    }
    scope[n.vars[0]] = (*item.list)[0];
    scope[n.vars[1]] = (*item.list)[1];
    return true;
  }

  void Set(const Node& n) {
    Value v = Eval(*n.expr);
    if (!status_.ok()) return;
    if (n.target_attr.empty()) {
      scopes_.back()[n.target] = std::move(v);
      return;
    }
    Value obj = Lookup(n.target);
    if (!obj.is_dict()) {
      Fail(n.line, absl::StrCat("cannot set ", n.target, ".", n.target_attr, ": ", n.target,
                                " is not a namespace"));
      return;
    }
    obj.dict->Set(n.target_attr, std::move(v));
  }

  // ---- expressions ----
  Value Eval(const Expr& e) {
    if (!status_.ok()) return {};
    if (++call_depth_ > kMaxCallDepth) {
      Fail(e.line, "expression nested too deeply");
      return {};
    }
    Value v = EvalInner(e);
    --call_depth_;
    return v;
  }

  Value EvalInner(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.literal;
      case Expr::Kind::kName:
        return Lookup(e.name);
      case Expr::Kind::kAttr:
        return Attr(Eval(*e.args[0]), e.name);
      case Expr::Kind::kIndex:
        return Index(Eval(*e.args[0]), Eval(*e.args[1]), e.line);
      case Expr::Kind::kSlice:
        return Slice(e);
      case Expr::Kind::kCall:
        return Call(e);
      case Expr::Kind::kFilter:
        return Filter(e);
      case Expr::Kind::kTest: {
        const bool r = Test(e);
        return Value::Bool(e.negated ? !r : r);
      }
      case Expr::Kind::kUnary: {
        const Value v = Eval(*e.args[0]);
        if (e.name == "not") return Value::Bool(!v.Truthy());
        if (v.kind == Value::Kind::kInt) return Value::Int(-v.i);
        if (v.kind == Value::Kind::kFloat) return Value::Float(-v.f);
        Fail(e.line, "unary - needs a number");
        return {};
      }
      case Expr::Kind::kBinary:
        return BinaryOp(e);
      case Expr::Kind::kCompare: {
        Value l = Eval(*e.args[0]);
        for (size_t k = 0; k < e.ops.size(); ++k) {
          Value r = Eval(*e.args[k + 1]);
          if (!status_.ok()) return {};
          const Value c = Compare(e.ops[k], l, r, e.line);
          if (!c.Truthy()) return c;
          l = std::move(r);
        }
        return Value::Bool(true);
      }
      case Expr::Kind::kCond: {
        if (Eval(*e.args[1]).Truthy()) return Eval(*e.args[0]);
        return e.args[2] ? Eval(*e.args[2]) : Value();
      }
      case Expr::Kind::kList: {
        ValueList list;
        for (const auto& a : e.args) list.push_back(Eval(*a));
        return Value::List(std::move(list));
      }
      case Expr::Kind::kDict: {
        ValueDict dict;
        bool keys_tainted = false;
        for (size_t k = 0; k + 1 < e.args.size(); k += 2) {
          const Value key = Eval(*e.args[k]);
          if (!key.is_string()) {
            Fail(e.line, "dict keys must be strings");
            return {};
          }
          keys_tainted = keys_tainted || key.tainted;
          dict.Set(key.s, Eval(*e.args[k + 1]));
        }
        Value d = Value::Dict(std::move(dict));
        d.tainted = keys_tainted;
        return d;
      }
    }
    return {};
  }

  Value Lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto found = it->find(name);
      if (found != it->end()) return found->second;
    }
    return {};
  }

  static Value Attr(const Value& obj, const std::string& name) {
    if (obj.is_dict()) {
      if (const Value* v = obj.dict->Get(name)) return *v;
    }
    return {};
  }

  Value Index(const Value& obj, const Value& key, int line) {
    if (obj.is_dict() && key.is_string()) {
      if (const Value* v = obj.dict->Get(key.s)) return *v;
      return {};
    }
    if ((obj.is_list() || obj.is_string()) && key.kind == Value::Kind::kInt) {
      const int64_t len = obj.is_list() ? static_cast<int64_t>(obj.list->size())
                                        : static_cast<int64_t>(Chars(obj.s).size());
      int64_t k = key.i < 0 ? key.i + len : key.i;
      if (k < 0 || k >= len) return {};
      if (obj.is_list()) return (*obj.list)[k];
      return Value::Str(std::string(Chars(obj.s)[k]), obj.tainted);
    }
    if (obj.is_undefined() || obj.is_none()) return {};
    Fail(line, absl::StrCat("cannot index ", Describe(obj), " with ", Describe(key)));
    return {};
  }

  Value Slice(const Expr& e) {
    const Value obj = Eval(*e.args[0]);
    const Value lo = e.args[1] ? Eval(*e.args[1]) : Value::None();
    const Value hi = e.args[2] ? Eval(*e.args[2]) : Value::None();
    const Value st = e.args[3] ? Eval(*e.args[3]) : Value::None();
    if (!status_.ok()) return {};
    if (!obj.is_list() && !obj.is_string()) {
      if (!obj.is_undefined()) Fail(e.line, absl::StrCat("cannot slice ", Describe(obj)));
      return {};
    }
    if (st.kind == Value::Kind::kInt && st.i == 0) {
      Fail(e.line, "slice step cannot be zero");
      return {};
    }
    std::vector<absl::string_view> chars;
    if (obj.is_string()) chars = Chars(obj.s);
    const int64_t len =
        obj.is_list() ? static_cast<int64_t>(obj.list->size()) : static_cast<int64_t>(chars.size());
    // A stride past the length takes the first item only, as any larger one does; clamping keeps
    // k += step from overflowing.
    const int64_t step =
        st.kind == Value::Kind::kInt ? std::clamp<int64_t>(st.i, -(len + 1), len + 1) : 1;
    // Python's slice.indices(): negative bounds count from the end, then clamp to the range a
    // step of this sign can start from.
    const int64_t lower = step < 0 ? -1 : 0, upper = step < 0 ? len - 1 : len;
    auto bound = [&](const Value& v, int64_t dflt) -> int64_t {
      if (v.kind != Value::Kind::kInt) return dflt;
      const int64_t k = v.i < 0 ? v.i + len : v.i;
      return std::max(lower, std::min(k, upper));
    };
    const int64_t b = bound(lo, step < 0 ? upper : lower);
    const int64_t en = bound(hi, step < 0 ? lower : upper);
    ValueList list_out;
    std::string str_out;
    for (int64_t k = b; step > 0 ? k < en : k > en; k += step) {
      if (obj.is_list()) {
        list_out.push_back((*obj.list)[k]);
      } else {
        str_out.append(chars[k].data(), chars[k].size());
      }
    }
    if (obj.is_list()) return Value::List(std::move(list_out));
    return Value::Str(std::move(str_out), obj.tainted);
  }

  Value BinaryOp(const Expr& e) {
    const std::string& op = e.name;
    if (op == "and") {
      Value l = Eval(*e.args[0]);
      return l.Truthy() ? Eval(*e.args[1]) : l;
    }
    if (op == "or") {
      Value l = Eval(*e.args[0]);
      return l.Truthy() ? l : Eval(*e.args[1]);
    }
    const Value l = Eval(*e.args[0]);
    const Value r = Eval(*e.args[1]);
    if (!status_.ok()) return {};
    if (op == "==" || op == "!=" || op == "in" || op == "not in" || op == "<" || op == ">" ||
        op == "<=" || op == ">=") {
      return Compare(op, l, r, e.line);
    }
    // Values are bounded like the output: a string doubled in a loop reached 4 GB (bad_alloc)
    // within the step limit.
    if (op == "~") {
      std::string s = ToPythonStr(l);
      const std::string t = ToPythonStr(r);
      if (s.size() + t.size() > kMaxOutputBytes) return TooLarge(e.line);
      return TaintedStr(s + t, l.DeepTainted() || r.DeepTainted());
    }
    if (op == "+" && l.is_string() && r.is_string()) {
      if (l.s.size() + r.s.size() > kMaxOutputBytes) return TooLarge(e.line);
      return TaintedStr(l.s + r.s, l.tainted || r.tainted);
    }
    if (op == "+" && l.is_list() && r.is_list()) {
      if (l.list->size() + r.list->size() > kMaxSteps) return TooLarge(e.line);
      ValueList out = *l.list;
      out.insert(out.end(), r.list->begin(), r.list->end());
      return Value::List(std::move(out));
    }
    if (l.is_number() && r.is_number()) {
      const bool ints = l.kind == Value::Kind::kInt && r.kind == Value::Kind::kInt;
      if (op == "+")
        return ints ? Value::Int(l.i + r.i) : Value::Float(l.AsDouble() + r.AsDouble());
      if (op == "-")
        return ints ? Value::Int(l.i - r.i) : Value::Float(l.AsDouble() - r.AsDouble());
      if (op == "*")
        return ints ? Value::Int(l.i * r.i) : Value::Float(l.AsDouble() * r.AsDouble());
      if (r.AsDouble() == 0) {
        Fail(e.line, "division by zero");
        return {};
      }
      if (op == "/") return Value::Float(l.AsDouble() / r.AsDouble());
      if (op == "//") {
        if (ints)
          return Value::Int(static_cast<int64_t>(std::floor(static_cast<double>(l.i) / r.i)));
        return Value::Float(std::floor(l.AsDouble() / r.AsDouble()));
      }
      if (op == "%") {
        if (ints) return Value::Int(((l.i % r.i) + r.i) % r.i);
        return Value::Float(std::fmod(l.AsDouble(), r.AsDouble()));
      }
    }
    Fail(e.line,
         absl::StrCat("unsupported operands for '", op, "': ", Describe(l), " and ", Describe(r)));
    return {};
  }

  // One comparison operator (== != < > <= >= in, not in).
  Value Compare(const std::string& op, const Value& l, const Value& r, int line) {
    if (op == "==") return Value::Bool(Equals(l, r));
    if (op == "!=") return Value::Bool(!Equals(l, r));
    if (op == "in" || op == "not in") {
      bool found = false;
      if (r.is_string() && l.is_string()) {
        found = absl::StrContains(r.s, l.s);
      } else if (r.is_list()) {
        for (const Value& x : *r.list) found = found || Equals(x, l);
      } else if (r.is_dict() && l.is_string()) {
        found = r.dict->Get(l.s) != nullptr;
      } else if (!r.is_undefined() && !r.is_none()) {
        Fail(line, absl::StrCat("'in' needs a string, list or dict, not ", Describe(r)));
      }
      return Value::Bool(op == "in" ? found : !found);
    }
    int cmp = 0;
    if (l.is_number() && r.is_number()) {
      cmp = l.AsDouble() < r.AsDouble() ? -1 : l.AsDouble() > r.AsDouble() ? 1 : 0;
    } else if (l.is_string() && r.is_string()) {
      cmp = l.s.compare(r.s);
    } else {
      Fail(line, absl::StrCat("cannot compare ", Describe(l), " and ", Describe(r)));
      return {};
    }
    if (op == "<") return Value::Bool(cmp < 0);
    if (op == ">") return Value::Bool(cmp > 0);
    if (op == "<=") return Value::Bool(cmp <= 0);
    return Value::Bool(cmp >= 0);
  }

  bool Test(const Expr& e) {
    const Value v = Eval(*e.args[0]);
    const std::string& t = e.name;
    if (t == "defined") return !v.is_undefined();
    if (t == "undefined") return v.is_undefined();
    if (t == "none") return v.is_none();
    if (t == "string") return v.is_string();
    if (t == "number") return v.is_number();
    if (t == "integer") return v.kind == Value::Kind::kInt;
    if (t == "float") return v.kind == Value::Kind::kFloat;
    if (t == "boolean") return v.kind == Value::Kind::kBool;
    if (t == "true") return v.kind == Value::Kind::kBool && v.b;
    if (t == "false") return v.kind == Value::Kind::kBool && !v.b;
    if (t == "mapping") return v.is_dict();
    if (t == "iterable") return v.is_list() || v.is_dict() || v.is_string();
    if (t == "sequence") return v.is_list() || v.is_dict() || v.is_string();
    if (t == "odd" || t == "even") {
      if (v.kind != Value::Kind::kInt) return false;
      return (((v.i % 2) + 2) % 2 == 1) == (t == "odd");
    }
    Fail(e.line, absl::StrCat("unsupported Jinja test '", t, "'"));
    return false;
  }

  Value Filter(const Expr& e) {
    const Value v = Eval(*e.args[0]);
    std::vector<Value> args;
    for (size_t k = 1; k < e.args.size(); ++k) args.push_back(Eval(*e.args[k]));
    if (!status_.ok()) return {};
    const std::string& f = e.name;
    const bool taint = v.DeepTainted();
    auto arg = [&](size_t k) { return k < args.size() ? args[k] : Value(); };
    if (f == "tojson") {
      std::string item_sep = ", ", key_sep = ": ";
      for (const auto& [key, expr] : e.kwargs) {
        const Value kv = Eval(*expr);
        if (key == "indent" && kv.is_none()) continue;
        if (key == "ensure_ascii" && kv.kind == Value::Kind::kBool && !kv.b) continue;
        if (key == "separators" && kv.is_list() && kv.list->size() == 2 &&
            (*kv.list)[0].is_string() && (*kv.list)[1].is_string()) {
          item_sep = (*kv.list)[0].s;
          key_sep = (*kv.list)[1].s;
          continue;
        }
        Fail(e.line, absl::StrCat("unsupported tojson argument '", key, "'"));
        return {};
      }
      if (!args.empty()) {
        Fail(e.line, "unsupported tojson positional argument");
        return {};
      }
      return TaintedStr(PythonJsonDumps(ToJson(v), item_sep, key_sep), taint);
    }
    if (f == "length" || f == "count") {
      // jinja2's Undefined has length 0: `tools|length > 0` with no tools is false, not an error.
      if (v.is_undefined()) return Value::Int(0);
      const int64_t n = PythonLength(v);
      if (n < 0) {
        Fail(e.line, absl::StrCat("length of ", Describe(v)));
        return {};
      }
      return Value::Int(n);
    }
    if (f == "string") return TaintedStr(ToPythonStr(v), taint);
    if (f == "safe") return v;
    // jinja2's string filters are str(value) then Python's str method, Unicode case and all.
    if (f == "trim" && (args.empty() || arg(0).is_string() || arg(0).is_none())) {
      const std::string* chars = arg(0).is_string() ? &args[0].s : nullptr;
      return TaintedStr(PyStrip(ToPythonStr(v), chars, true, true), taint);
    }
    if (f == "upper") return TaintedStr(PyUpper(ToPythonStr(v)), taint);
    if (f == "lower") return TaintedStr(PyLower(ToPythonStr(v)), taint);
    if (f == "capitalize") return TaintedStr(PyCapitalize(ToPythonStr(v)), taint);
    if (f == "title") return TaintedStr(JinjaTitle(ToPythonStr(v)), taint);
    if (f == "default" || f == "d") {
      const bool boolean = arg(1).Truthy();
      if (v.is_undefined() || (boolean && !v.Truthy()))
        return arg(0).is_undefined() ? Value::Str("") : arg(0);
      return v;
    }
    if (f == "first" || f == "last") {
      if (v.is_list()) {
        if (v.list->empty()) return {};
        return f == "first" ? v.list->front() : v.list->back();
      }
      if (v.is_string()) {
        auto chars = Chars(v.s);
        if (chars.empty()) return {};
        return Value::Str(std::string(f == "first" ? chars.front() : chars.back()), v.tainted);
      }
    }
    if (f == "join" && v.is_list()) {
      const std::string sep = arg(0).is_string() ? arg(0).s : "";
      std::string out;
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += sep;
        out += ToPythonStr((*v.list)[k]);
      }
      return TaintedStr(std::move(out), taint || arg(0).DeepTainted());
    }
    if (f == "list") {
      if (v.is_list()) return v;
      if (v.is_string()) {
        ValueList out;
        for (absl::string_view ch : Chars(v.s))
          out.push_back(Value::Str(std::string(ch), v.tainted));
        return Value::List(std::move(out));
      }
      if (v.is_dict()) return Method(v, "keys", {}, e.line);
    }
    if (f == "items" && v.is_dict()) return Method(v, "items", {}, e.line);
    if (f == "int" || f == "float") return NumberFilter(e, v, args);
    if (f == "abs" && v.is_number()) {
      return v.kind == Value::Kind::kInt ? Value::Int(v.i < 0 ? -v.i : v.i)
                                         : Value::Float(std::fabs(v.f));
    }
    if (f == "replace" && args.size() >= 2 && args.size() <= 3) {
      // jinja2: str(s).replace(str(old), str(new), count), count None or absent for all.
      Value count = arg(2);
      for (const auto& [key, expr] : e.kwargs) {
        if (key == "count") count = Eval(*expr);
      }
      if (!count.is_undefined() && !count.is_none() && count.kind != Value::Kind::kInt) {
        Fail(e.line, "replace's count must be an integer");
        return {};
      }
      const int64_t n = count.kind == Value::Kind::kInt ? count.i : -1;
      return TaintedStr(PyReplace(ToPythonStr(v), ToPythonStr(arg(0)), ToPythonStr(arg(1)), n),
                        taint || arg(1).DeepTainted());
    }
    Fail(e.line, absl::StrCat("unsupported Jinja filter '", f, "' on ", Describe(v)));
    return {};
  }

  // jinja2's int(default=0, base=10) and float(default=0.0): Python's int(str, base), else
  // int(float(str)) (so '3.7' is 3), else the default; bools are 0 and 1; no prefix of a string
  // counts ('12abc' is the default). Undefined is an error there, as in jinja2.
  Value NumberFilter(const Expr& e, const Value& v, const std::vector<Value>& args) {
    const bool to_int = e.name == "int";
    Value dflt = !args.empty() ? args[0] : to_int ? Value::Int(0) : Value::Float(0);
    Value base = args.size() > 1 ? args[1] : Value::Int(10);
    for (const auto& [key, expr] : e.kwargs) {
      if (key == "default") {
        dflt = Eval(*expr);
      } else if (key == "base" && to_int) {
        base = Eval(*expr);
      } else {
        Fail(e.line, absl::StrCat("unsupported ", e.name, " argument '", key, "'"));
        return {};
      }
    }
    if (args.size() > (to_int ? 2u : 1u) || base.kind != Value::Kind::kInt) {
      Fail(e.line, absl::StrCat("unsupported arguments to ", e.name));
      return {};
    }
    if (v.is_undefined()) {
      Fail(e.line, absl::StrCat("undefined value to ", e.name));
      return {};
    }
    double d = 0;
    if (v.kind == Value::Kind::kBool) {
      d = v.b ? 1 : 0;
    } else if (v.is_number()) {
      if (to_int && v.kind == Value::Kind::kInt) return v;
      d = v.AsDouble();
    } else if (v.is_string()) {
      if (to_int) {
        int64_t i = 0;
        const PyIntParse r = PyParseInt(v.s, static_cast<int>(base.i), &i);
        if (r == PyIntParse::kOk) return Value::Int(i);
        if (r == PyIntParse::kOutOfRange) {
          Fail(e.line, "int: the number does not fit 64 bits");
          return {};
        }
      }
      if (!PyParseFloat(v.s, &d)) return dflt;
    } else {
      return dflt;
    }
    if (!to_int) return Value::Float(d);
    if (std::isnan(d)) return dflt;
    if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0)) {
      Fail(e.line, "int: the number does not fit 64 bits");
      return {};
    }
    return Value::Int(static_cast<int64_t>(d));
  }

  Value Call(const Expr& e) {
    const Expr& callee = *e.args[0];
    std::vector<Value> args;
    for (size_t k = 1; k < e.args.size(); ++k) args.push_back(Eval(*e.args[k]));
    if (!status_.ok()) return {};
    if (callee.kind == Expr::Kind::kAttr) {
      if (!e.kwargs.empty()) {
        Fail(e.line, "keyword arguments to methods are not supported");
        return {};
      }
      return Method(Eval(*callee.args[0]), callee.name, args, e.line);
    }
    if (callee.kind != Expr::Kind::kName) {
      Fail(e.line, "only named functions and methods can be called");
      return {};
    }
    const std::string& fn = callee.name;
    if (fn == "raise_exception") {
      Fail(e.line, absl::StrCat("the template raised: ", args.empty() ? "" : ToPythonStr(args[0])));
      return {};
    }
    if (fn == "namespace") {
      ValueDict ns;
      for (const auto& [k, x] : e.kwargs) ns.Set(k, Eval(*x));
      return Value::Dict(std::move(ns));
    }
    if (fn == "range") {
      int64_t b = 0, en = 0, step = 1;
      for (const Value& a : args) {
        if (a.kind != Value::Kind::kInt) {
          Fail(e.line, "range() takes integers");
          return {};
        }
      }
      if (args.size() == 1) en = args[0].i;
      if (args.size() >= 2) b = args[0].i, en = args[1].i;
      if (args.size() == 3) step = args[2].i;
      if (args.empty() || args.size() > 3 || step == 0) {
        Fail(e.line, "range() takes 1 to 3 arguments and a non-zero step");
        return {};
      }
      ValueList out;
      for (int64_t k = b; step > 0 ? k < en : k > en; k += step) {
        if (!Step(e.line)) return {};
        out.push_back(Value::Int(k));
      }
      return Value::List(std::move(out));
    }
    Fail(e.line, absl::StrCat("unsupported Jinja function '", fn, "'"));
    return {};
  }

  Value Method(const Value& obj, const std::string& m, const std::vector<Value>& args, int line) {
    auto arg_str = [&](size_t k) -> const std::string* {
      return k < args.size() && args[k].is_string() ? &args[k].s : nullptr;
    };
    if (obj.is_dict()) {
      if (m == "get" && !args.empty() && args[0].is_string()) {
        if (const Value* v = obj.dict->Get(args[0].s)) return *v;
        return args.size() > 1 ? args[1] : Value::None();
      }
      if (m == "items" || m == "keys" || m == "values") {
        ValueList out;
        for (const auto& [k, v] : obj.dict->items) {
          if (m == "items") {
            out.push_back(Value::List({Value::Str(k, obj.tainted), v}));
          } else {
            out.push_back(m == "keys" ? Value::Str(k, obj.tainted) : v);
          }
        }
        return Value::List(std::move(out));
      }
    }
    if (obj.is_list()) {
      if (m == "append" && args.size() == 1) {
        obj.list->push_back(args[0]);
        return Value::None();
      }
      if (m == "pop" && args.size() <= 1) {
        if (obj.list->empty()) {
          Fail(line, "pop from an empty list");
          return {};
        }
        int64_t k = args.empty() ? -1 : (args[0].kind == Value::Kind::kInt ? args[0].i : 0);
        const int64_t len = static_cast<int64_t>(obj.list->size());
        if (k < 0) k += len;
        if (k < 0 || k >= len) {
          Fail(line, "pop index out of range");
          return {};
        }
        Value v = (*obj.list)[k];
        obj.list->erase(obj.list->begin() + k);
        return v;
      }
    }
    if (obj.is_string()) {
      const std::string& s = obj.s;
      if ((m == "startswith" || m == "endswith") && arg_str(0)) {
        return Value::Bool(m == "startswith" ? absl::StartsWith(s, *arg_str(0))
                                             : absl::EndsWith(s, *arg_str(0)));
      }
      if ((m == "strip" || m == "lstrip" || m == "rstrip") &&
          (args.empty() || (args.size() == 1 && (arg_str(0) || args[0].is_none())))) {
        return Value::Str(PyStrip(s, arg_str(0), m != "rstrip", m != "lstrip"), obj.tainted);
      }
      if (args.empty()) {
        if (m == "upper") return Value::Str(PyUpper(s), obj.tainted);
        if (m == "lower") return Value::Str(PyLower(s), obj.tainted);
        if (m == "title") return Value::Str(PyTitle(s), obj.tainted);
        if (m == "capitalize") return Value::Str(PyCapitalize(s), obj.tainted);
      }
      if (m == "split" && (args.empty() || arg_str(0))) {
        ValueList out;
        if (args.empty()) {
          for (absl::string_view p :
               absl::StrSplit(s, absl::ByAnyChar(" \t\n\r\v\f"), absl::SkipEmpty())) {
            out.push_back(Value::Str(std::string(p), obj.tainted));
          }
        } else if (!arg_str(0)->empty()) {
          for (absl::string_view p : absl::StrSplit(s, *arg_str(0))) {
            out.push_back(Value::Str(std::string(p), obj.tainted));
          }
        }
        return Value::List(std::move(out));
      }
      if (m == "replace" && arg_str(0) && arg_str(1) &&
          (args.size() == 2 || (args.size() == 3 && args[2].kind == Value::Kind::kInt))) {
        return Value::Str(PyReplace(s, *arg_str(0), *arg_str(1), args.size() == 3 ? args[2].i : -1),
                          obj.tainted || args[1].tainted);
      }
    }
    Fail(line, absl::StrCat("unsupported method '", m, "' on ", Describe(obj)));
    return {};
  }

  // ---- helpers ----
  static std::vector<absl::string_view> Chars(absl::string_view s) {
    std::vector<absl::string_view> out;
    for (size_t i = 0; i < s.size();) {
      size_t j = i + 1;
      while (j < s.size() && (static_cast<uint8_t>(s[j]) & 0xC0) == 0x80) ++j;
      out.push_back(s.substr(i, j - i));
      i = j;
    }
    return out;
  }

  static std::string Describe(const Value& v) {
    switch (v.kind) {
      case Value::Kind::kUndefined:
        return "undefined";
      case Value::Kind::kNone:
        return "none";
      case Value::Kind::kBool:
        return "a boolean";
      case Value::Kind::kInt:
        return "an integer";
      case Value::Kind::kFloat:
        return "a float";
      case Value::Kind::kString:
        return "a string";
      case Value::Kind::kList:
        return "a list";
      case Value::Kind::kDict:
        return "a dict";
    }
    return "a value";
  }

  void Emit(const std::string& text, bool trusted) {
    bytes_ += text.size();
    if (bytes_ > kMaxOutputBytes) {
      Fail(0, "the rendered prompt exceeds 64 MiB");
      return;
    }
    AppendSegment(out_, text, trusted);
  }

  Value TooLarge(int line) {
    Fail(line, "a value in the template grows past 64 MiB (or a million items)");
    return {};
  }

  bool Step(int line) {
    if (++steps_ > kMaxSteps) {
      Fail(line, "the template runs too long (over a million steps)");
      return false;
    }
    return true;
  }

  void Fail(int line, const std::string& what) {
    if (status_.ok()) {
      status_ = absl::InvalidArgumentError(absl::StrCat("chat template line ", line, ": ", what));
    }
  }

  std::vector<std::map<std::string, Value>> scopes_;
  Prompt* out_;
  absl::Status status_;
  size_t bytes_ = 0;
  int64_t steps_ = 0;
  int call_depth_ = 0;
};

}  // namespace

absl::StatusOr<Prompt> Template::Render(const std::map<std::string, Value>& globals) const {
  Prompt out;
  Renderer r(globals, &out);
  if (absl::Status s = r.Run(body_); !s.ok()) return s;
  return out;
}

}  // namespace kimi::tokenizer::jinja
