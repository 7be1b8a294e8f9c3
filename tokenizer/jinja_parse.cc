// Lexer and parser of the Jinja subset: template text -> chunks (text, {{ }}, {% %}) with
// whitespace control applied -> statement tree with expression trees.
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <set>

#include "absl/strings/str_cat.h"
#include "tokenizer/jinja.h"
#include "tokenizer/jinja_ast.h"
#include "tokenizer/utf8.h"

namespace kimi::tokenizer::jinja {
namespace {

constexpr int kMaxDepth = 200;  // nesting of blocks and expressions

struct Chunk {
  enum class Kind { kText, kExpr, kStmt };
  Kind kind;
  std::string content;
  int line;
};

bool IsJinjaSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

int LineAt(absl::string_view src, size_t pos) {
  int line = 1;
  for (size_t i = 0; i < pos && i < src.size(); ++i) line += src[i] == '\n';
  return line;
}

// Splits the source into chunks, applying `-` whitespace control, trim_blocks and lstrip_blocks.
absl::StatusOr<std::vector<Chunk>> Lex(absl::string_view src) {
  std::vector<Chunk> chunks;
  size_t pos = 0;
  bool strip_next_text = false;
  while (pos <= src.size()) {
    size_t tag = src.find('{', pos);
    while (tag != absl::string_view::npos && tag + 1 < src.size() && src[tag + 1] != '{' &&
           src[tag + 1] != '%' && src[tag + 1] != '#') {
      tag = src.find('{', tag + 1);
    }
    if (tag != absl::string_view::npos && tag + 1 >= src.size()) tag = absl::string_view::npos;
    const size_t text_end = tag == absl::string_view::npos ? src.size() : tag;
    std::string text(src.substr(pos, text_end - pos));
    if (strip_next_text) {
      size_t k = 0;
      while (k < text.size() && IsJinjaSpace(text[k])) ++k;
      text.erase(0, k);
      strip_next_text = false;
    }
    if (tag == absl::string_view::npos) {
      if (!text.empty()) chunks.push_back({Chunk::Kind::kText, text, LineAt(src, pos)});
      break;
    }
    const char type = src[tag + 1];
    const char left = tag + 2 < src.size() ? src[tag + 2] : '\0';
    if (left == '-') {
      while (!text.empty() && IsJinjaSpace(text.back())) text.pop_back();
    } else if (type != '{' && left != '+') {
      // lstrip_blocks: spaces/tabs between a line start and a block or comment tag go.
      size_t k = text_end;
      while (k > pos && (src[k - 1] == ' ' || src[k - 1] == '\t')) --k;
      if (k == 0 || src[k - 1] == '\n') {
        text.resize(text.size() - std::min(text.size(), text_end - k));
      }
    }
    if (!text.empty()) chunks.push_back({Chunk::Kind::kText, text, LineAt(src, pos)});

    const char* close = type == '{' ? "}}" : type == '%' ? "%}" : "#}";
    size_t end = absl::string_view::npos;
    char quote = 0;
    for (size_t i = tag + 2; i + 1 < src.size(); ++i) {
      const char c = src[i];
      if (type != '#' && quote) {
        if (c == '\\') {
          ++i;
        } else if (c == quote) {
          quote = 0;
        }
        continue;
      }
      if (type != '#' && (c == '\'' || c == '"')) {
        quote = c;
        continue;
      }
      if (c == close[0] && src[i + 1] == close[1]) {
        end = i;
        break;
      }
    }
    if (end == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat("chat template line ", LineAt(src, tag),
                                                     ": unterminated tag (no \"", close, "\")"));
    }
    size_t cb = tag + 2, ce = end;
    if (cb < ce && (src[cb] == '-' || src[cb] == '+')) ++cb;
    bool right_strip = false;
    if (ce > cb && src[ce - 1] == '-') {
      right_strip = true;
      --ce;
    }
    const int line = LineAt(src, tag);
    if (type != '#') {
      chunks.push_back({type == '{' ? Chunk::Kind::kExpr : Chunk::Kind::kStmt,
                        std::string(src.substr(cb, ce - cb)), line});
    }
    pos = end + 2;
    if (right_strip) {
      strip_next_text = true;
    } else if (type != '{' && pos < src.size() && src[pos] == '\n') {
      ++pos;  // trim_blocks: one newline after a block or comment tag goes (\r\n is \n by now)
    }
    if (pos == src.size()) break;
  }
  return chunks;
}

// As jinja2 reads a source (keep_trailing_newline off): \r\n and \r become \n everywhere, text and
// string literals alike, and one newline at the very end goes (HF renders templates so, and a kept
// newline is one more token in every prompt).
std::string NormalizeNewlines(absl::string_view src) {
  std::string out;
  out.reserve(src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] == '\r') {
      out += '\n';
      if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
    } else {
      out += src[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

struct Tok {
  enum class Kind { kName, kString, kInt, kFloat, kOp, kEnd };
  Kind kind = Kind::kEnd;
  std::string text;  // name, op, or decoded string
  int64_t i = 0;
  double f = 0;
};

// The character of a one-letter Python escape (\n, \t, ...), or 0.
char SimpleEscape(char e) {
  switch (e) {
    case 'n':
      return '\n';
    case 't':
      return '\t';
    case 'r':
      return '\r';
    case 'a':
      return '\a';
    case 'b':
      return '\b';
    case 'f':
      return '\f';
    case 'v':
      return '\v';
    case '\\':
    case '\'':
    case '"':
      return e;
    default:
      return 0;
  }
}

int HexDigit(char h) {
  if (h >= '0' && h <= '9') return h - '0';
  if (h >= 'a' && h <= 'f') return h - 'a' + 10;
  if (h >= 'A' && h <= 'F') return h - 'A' + 10;
  return -1;
}

absl::StatusOr<std::vector<Tok>> Tokenize(absl::string_view s, int line) {
  std::vector<Tok> toks;
  auto error = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("chat template line ", line, ": ", what));
  };
  size_t i = 0;
  while (i < s.size()) {
    const char c = s[i];
    if (IsJinjaSpace(c)) {
      ++i;
      continue;
    }
    Tok t;
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
      t.kind = Tok::Kind::kName;
      t.text = std::string(s.substr(i, j - i));
      i = j;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t j = i;
      bool is_float = false;
      while (j < s.size() &&
             (std::isdigit(static_cast<unsigned char>(s[j])) || s[j] == '.' || s[j] == '_')) {
        if (s[j] == '.') {
          if (is_float || j + 1 >= s.size() || !std::isdigit(static_cast<unsigned char>(s[j + 1])))
            break;
          is_float = true;
        }
        ++j;
      }
      std::string num;
      for (char d : s.substr(i, j - i)) {
        if (d != '_') num += d;
      }
      if (is_float) {
        t.kind = Tok::Kind::kFloat;
        t.f = std::strtod(num.c_str(), nullptr);
      } else {
        t.kind = Tok::Kind::kInt;
        if (num.size() > 18) return error("integer literal too large");
        t.i = std::strtoll(num.c_str(), nullptr, 10);
      }
      i = j;
    } else if (c == '\'' || c == '"') {
      std::string out;
      size_t j = i + 1;
      for (; j < s.size() && s[j] != c; ++j) {
        if (s[j] != '\\' || j + 1 >= s.size()) {
          out += s[j];
          continue;
        }
        // Python's string escapes, as jinja2 decodes literals (unicode-escape): an unknown one
        // keeps its backslash.
        const char e = s[++j];
        const char simple = SimpleEscape(e);
        if (simple) {
          out += simple;
        } else if (e == '\n') {
          // A backslash before a line break joins the lines.
        } else if (e >= '0' && e <= '7') {
          uint32_t v = e - '0';
          for (int k = 0; k < 2 && j + 1 < s.size() && s[j + 1] >= '0' && s[j + 1] <= '7'; ++k)
            v = v * 8 + (s[++j] - '0');
          AppendUtf8(v, &out);
        } else if (e == 'x' || e == 'u' || e == 'U') {
          const size_t digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t v = 0;
          for (size_t k = 0; k < digits; ++k) {
            const int d = j + 1 < s.size() ? HexDigit(s[j + 1]) : -1;
            if (d < 0) return error(absl::StrCat("truncated \\", std::string(1, e), " escape"));
            v = v * 16 + static_cast<uint32_t>(d);
            ++j;
          }
          if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) {
            return error(
                absl::StrCat("escape \\", std::string(1, e), " is not a Unicode scalar value"));
          }
          AppendUtf8(v, &out);
        } else if (e == 'N') {
          return error("unsupported escape \\N{...} (write the character itself)");
        } else {
          out += '\\';
          out += e;
        }
      }
      if (j >= s.size()) return error("unterminated string literal");
      t.kind = Tok::Kind::kString;
      t.text = std::move(out);
      i = j + 1;
    } else {
      static const char* kOps[] = {"==", "!=", "<=", ">=", "//", "**", "<", ">", "+",
                                   "-",  "*",  "/",  "%",  "~",  "|",  ".", ",", ":",
                                   "(",  ")",  "[",  "]",  "{",  "}",  "="};
      t.kind = Tok::Kind::kOp;
      for (const char* op : kOps) {
        if (s.substr(i, std::char_traits<char>::length(op)) == op) {
          t.text = op;
          break;
        }
      }
      if (t.text.empty())
        return error(absl::StrCat("unexpected character '", std::string(1, c), "'"));
      i += t.text.size();
    }
    toks.push_back(std::move(t));
  }
  toks.push_back(Tok{});
  return toks;
}

class Parser {
 public:
  explicit Parser(std::vector<Chunk> chunks) : chunks_(std::move(chunks)) {}

  absl::StatusOr<std::vector<Node>> Run() {
    std::string ended_by;
    std::vector<Node> body = Body({}, &ended_by);
    if (!status_.ok()) return status_;
    return body;
  }

 private:
  // ---- statements ----
  // Parses nodes until a statement whose keyword is in `ends` (consumed; its name in *ended_by,
  // its tokens current) or the end of the template (only allowed when `ends` is empty).
  std::vector<Node> Body(const std::set<std::string>& ends, std::string* ended_by) {
    std::vector<Node> nodes;
    if (++depth_ > kMaxDepth) {
      Fail(line_, "blocks nested too deeply");
      return nodes;
    }
    while (status_.ok() && ci_ < chunks_.size()) {
      const Chunk& c = chunks_[ci_++];
      line_ = c.line;
      if (c.kind == Chunk::Kind::kText) {
        Node n;
        n.kind = Node::Kind::kText;
        n.line = c.line;
        n.text = c.content;
        nodes.push_back(std::move(n));
        continue;
      }
      if (!StartTokens(c)) break;
      if (c.kind == Chunk::Kind::kExpr) {
        Node n;
        n.kind = Node::Kind::kOutput;
        n.line = c.line;
        n.expr = Expression();
        ExpectEnd();
        nodes.push_back(std::move(n));
        continue;
      }
      if (Peek().kind != Tok::Kind::kName) {
        Fail(c.line, "a statement must start with a keyword");
        break;
      }
      const std::string kw = Next().text;
      if (ends.count(kw)) {
        *ended_by = kw;
        --depth_;
        return nodes;
      }
      Statement(kw, c.line, &nodes);
    }
    if (status_.ok() && !ends.empty()) {
      Fail(line_, absl::StrCat("missing {% ", *ends.rbegin(), " %}"));
    }
    --depth_;
    return nodes;
  }

  void Statement(const std::string& kw, int line, std::vector<Node>* nodes) {
    Node n;
    n.line = line;
    if (kw == "if") {
      n.kind = Node::Kind::kIf;
      std::string ended_by;
      ExprPtr cond = Expression();
      ExpectEnd();
      std::vector<Node> body = Body({"elif", "else", "endif"}, &ended_by);
      n.branches.emplace_back(std::move(cond), std::move(body));
      while (status_.ok() && ended_by == "elif") {
        cond = Expression();
        ExpectEnd();
        body = Body({"elif", "else", "endif"}, &ended_by);
        n.branches.emplace_back(std::move(cond), std::move(body));
      }
      if (status_.ok() && ended_by == "else") {
        ExpectEnd();
        n.else_body = Body({"endif"}, &ended_by);
      }
      ExpectEnd();
    } else if (kw == "for") {
      n.kind = Node::Kind::kFor;
      n.vars.push_back(ExpectName());
      if (Accept(",")) n.vars.push_back(ExpectName());
      if (!(Peek().kind == Tok::Kind::kName && Peek().text == "in")) {
        Fail(line, "expected 'in' in {% for %}");
        return;
      }
      Next();
      n.expr = Or();  // not Expression(): `x if c` here is a loop filter
      if (IsName("if")) {
        Next();
        n.filter = Expression();
      }
      if (Peek().kind == Tok::Kind::kName) {
        Fail(line, absl::StrCat("unsupported Jinja construct '", Peek().text,
                                "' in {% for %} (recursive loops)"));
        return;
      }
      ExpectEnd();
      std::string ended_by;
      n.body = Body({"else", "endfor"}, &ended_by);
      if (status_.ok() && ended_by == "else") {
        ExpectEnd();
        n.else_body = Body({"endfor"}, &ended_by);
      }
      ExpectEnd();
    } else if (kw == "set") {
      n.kind = Node::Kind::kSet;
      n.target = ExpectName();
      if (Accept(".")) n.target_attr = ExpectName();
      if (!Accept("=")) {
        Fail(line, "unsupported Jinja construct: block {% set %} (only {% set x = expr %})");
        return;
      }
      n.expr = Expression();
      ExpectEnd();
    } else if (kw == "break" || kw == "continue") {
      n.kind = kw == "break" ? Node::Kind::kBreak : Node::Kind::kContinue;
      ExpectEnd();
    } else if (kw == "elif" || kw == "else" || kw == "endif" || kw == "endfor") {
      Fail(line, absl::StrCat("unexpected {% ", kw, " %}"));
      return;
    } else {
      Fail(line, absl::StrCat("unsupported Jinja construct '{% ", kw,
                              " %}' (supported statements: if/elif/else/endif, for/else/endfor, "
                              "set, break, continue)"));
      return;
    }
    if (status_.ok()) nodes->push_back(std::move(n));
  }

  // ---- expressions ----
  ExprPtr Expression() {
    ExprPtr e = Or();
    if (Peek().kind == Tok::Kind::kName && Peek().text == "if") {
      Next();
      auto cond = MakeExpr(Expr::Kind::kCond);
      cond->args.push_back(std::move(e));
      cond->args.push_back(Or());
      if (Peek().kind == Tok::Kind::kName && Peek().text == "else") {
        Next();
        cond->args.push_back(Expression());
      } else {
        cond->args.push_back(nullptr);
      }
      return cond;
    }
    return e;
  }

  ExprPtr Binary(const std::string& op, ExprPtr l, ExprPtr r) {
    auto e = MakeExpr(Expr::Kind::kBinary);
    e->name = op;
    e->args.push_back(std::move(l));
    e->args.push_back(std::move(r));
    return e;
  }

  ExprPtr Or() {
    ExprPtr e = And();
    while (IsName("or")) {
      Next();
      e = Binary("or", std::move(e), And());
    }
    return e;
  }
  ExprPtr And() {
    ExprPtr e = Not();
    while (IsName("and")) {
      Next();
      e = Binary("and", std::move(e), Not());
    }
    return e;
  }
  ExprPtr Not() {
    if (IsName("not")) {
      Next();
      auto e = MakeExpr(Expr::Kind::kUnary);
      e->name = "not";
      if (!Deeper()) return e;
      e->args.push_back(Not());
      --depth_;
      return e;
    }
    return Compare();
  }
  // `a < b < c` is one chain (a < b and b < c, b evaluated once), as in jinja2 and Python; a single
  // comparison stays a plain binary node.
  ExprPtr Compare() {
    ExprPtr first = Math1();
    auto chain = MakeExpr(Expr::Kind::kCompare);
    while (status_.ok()) {
      const Tok& t = Peek();
      std::string op;
      if (t.kind == Tok::Kind::kOp && (t.text == "==" || t.text == "!=" || t.text == "<" ||
                                       t.text == ">" || t.text == "<=" || t.text == ">=")) {
        op = Next().text;
      } else if (IsName("in")) {
        Next();
        op = "in";
      } else if (IsName("not") && ti_ + 1 < toks_.size() &&
                 toks_[ti_ + 1].kind == Tok::Kind::kName && toks_[ti_ + 1].text == "in") {
        Next();
        Next();
        op = "not in";
      } else {
        break;
      }
      if (chain->args.empty()) chain->args.push_back(std::move(first));
      chain->ops.push_back(op);
      chain->args.push_back(Math1());
    }
    if (chain->ops.empty()) return first;
    if (chain->ops.size() == 1) {
      return Binary(chain->ops[0], std::move(chain->args[0]), std::move(chain->args[1]));
    }
    return chain;
  }
  ExprPtr Math1() {
    ExprPtr e = Concat();
    while (IsOp("+") || IsOp("-")) {
      const std::string op = Next().text;
      e = Binary(op, std::move(e), Concat());
    }
    return e;
  }
  ExprPtr Concat() {
    ExprPtr e = Math2();
    while (IsOp("~")) {
      Next();
      e = Binary("~", std::move(e), Math2());
    }
    return e;
  }
  ExprPtr Math2() {
    ExprPtr e = Unary();
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      const std::string op = Next().text;
      e = Binary(op, std::move(e), Unary());
    }
    if (IsOp("**")) Fail(line_, "unsupported operator '**'");
    return e;
  }
  // As jinja2's parse_unary: filters and tests apply to the negated value (`-1|abs` is 1, `-x is
  // odd` tests -x), and the operand of a sign takes no filters of its own.
  ExprPtr Unary(bool with_filters = true) {
    ExprPtr e;
    if (IsOp("-") || IsOp("+")) {
      const std::string op = Next().text;
      if (!Deeper()) return MakeExpr(Expr::Kind::kLiteral);
      ExprPtr inner = Unary(/*with_filters=*/false);
      --depth_;
      if (op == "+") {
        e = std::move(inner);
      } else {
        e = MakeExpr(Expr::Kind::kUnary);
        e->name = "-";
        e->args.push_back(std::move(inner));
      }
    } else {
      e = Primary();
    }
    e = Postfix(std::move(e));
    // Filters and tests bind tighter than any binary operator.
    while (with_filters && status_.ok()) {
      if (IsOp("|")) {
        Next();
        auto f = MakeExpr(Expr::Kind::kFilter);
        f->name = ExpectName();
        f->args.push_back(std::move(e));
        if (IsOp("(")) {
          Next();
          CallArgs(f.get());
        }
        e = std::move(f);
      } else if (IsName("is")) {
        Next();
        auto t = MakeExpr(Expr::Kind::kTest);
        if (IsName("not")) {
          Next();
          t->negated = true;
        }
        t->name = ExpectName();
        t->args.push_back(std::move(e));
        if (IsOp("(")) {
          Next();
          CallArgs(t.get());
        }
        e = std::move(t);
      } else {
        break;
      }
    }
    return e;
  }

  ExprPtr Primary() {
    if (!Deeper()) return MakeExpr(Expr::Kind::kLiteral);
    ExprPtr e = PrimaryInner();
    --depth_;
    return e;
  }

  ExprPtr PrimaryInner() {
    const Tok t = Next();
    auto lit = MakeExpr(Expr::Kind::kLiteral);
    switch (t.kind) {
      case Tok::Kind::kString: {
        std::string s = t.text;
        while (Peek().kind == Tok::Kind::kString) s += Next().text;  // 'a' 'b' concatenates
        lit->literal = Value::Str(std::move(s));
        return lit;
      }
      case Tok::Kind::kInt:
        lit->literal = Value::Int(t.i);
        return lit;
      case Tok::Kind::kFloat:
        lit->literal = Value::Float(t.f);
        return lit;
      case Tok::Kind::kName:
        if (t.text == "true" || t.text == "True") {
          lit->literal = Value::Bool(true);
        } else if (t.text == "false" || t.text == "False") {
          lit->literal = Value::Bool(false);
        } else if (t.text == "none" || t.text == "None") {
          lit->literal = Value::None();
        } else {
          auto n = MakeExpr(Expr::Kind::kName);
          n->name = t.text;
          return n;
        }
        return lit;
      case Tok::Kind::kOp:
        if (t.text == "(") {
          if (IsOp(")")) {
            Next();
            return MakeExpr(Expr::Kind::kList);  // () is an empty tuple
          }
          ExprPtr first = Expression();
          if (!IsOp(",")) {
            Expect(")");
            return first;
          }
          auto tuple = MakeExpr(Expr::Kind::kList);
          tuple->args.push_back(std::move(first));
          while (Accept(",") && !IsOp(")")) tuple->args.push_back(Expression());
          Expect(")");
          return tuple;
        }
        if (t.text == "[") {
          auto list = MakeExpr(Expr::Kind::kList);
          while (status_.ok() && !IsOp("]")) {
            list->args.push_back(Expression());
            if (!Accept(",")) break;
          }
          Expect("]");
          return list;
        }
        if (t.text == "{") {
          auto dict = MakeExpr(Expr::Kind::kDict);
          while (status_.ok() && !IsOp("}")) {
            dict->args.push_back(Expression());
            Expect(":");
            dict->args.push_back(Expression());
            if (!Accept(",")) break;
          }
          Expect("}");
          return dict;
        }
        break;
      default:
        break;
    }
    Fail(line_, t.kind == Tok::Kind::kEnd ? std::string("unexpected end of expression")
                                          : absl::StrCat("unexpected '", t.text, "'"));
    return lit;
  }

  ExprPtr Postfix(ExprPtr e) {
    while (status_.ok()) {
      if (IsOp(".")) {
        Next();
        auto a = MakeExpr(Expr::Kind::kAttr);
        a->name = ExpectName();
        a->args.push_back(std::move(e));
        e = std::move(a);
      } else if (IsOp("[")) {
        Next();
        ExprPtr lo = IsOp(":") ? nullptr : Expression();
        if (Accept(":")) {
          auto s = MakeExpr(Expr::Kind::kSlice);
          s->args.push_back(std::move(e));
          s->args.push_back(std::move(lo));
          s->args.push_back(IsOp("]") || IsOp(":") ? nullptr : Expression());
          s->args.push_back(Accept(":") && !IsOp("]") ? Expression() : nullptr);
          e = std::move(s);
        } else {
          auto ix = MakeExpr(Expr::Kind::kIndex);
          ix->args.push_back(std::move(e));
          ix->args.push_back(std::move(lo));
          e = std::move(ix);
        }
        Expect("]");
      } else if (IsOp("(")) {
        Next();
        auto call = MakeExpr(Expr::Kind::kCall);
        call->args.push_back(std::move(e));
        CallArgs(call.get());
        e = std::move(call);
      } else {
        break;
      }
    }
    return e;
  }

  // After "(": positional and keyword arguments, then ")".
  void CallArgs(Expr* call) {
    while (status_.ok() && !IsOp(")")) {
      if (Peek().kind == Tok::Kind::kName && ti_ + 1 < toks_.size() &&
          toks_[ti_ + 1].kind == Tok::Kind::kOp && toks_[ti_ + 1].text == "=") {
        std::string key = Next().text;
        Next();
        call->kwargs.emplace_back(std::move(key), Expression());
      } else {
        call->args.push_back(Expression());
      }
      if (!Accept(",")) break;
    }
    Expect(")");
  }

  // ---- token helpers ----
  bool StartTokens(const Chunk& c) {
    auto toks = Tokenize(c.content, c.line);
    if (!toks.ok()) {
      status_ = toks.status();
      return false;
    }
    toks_ = *std::move(toks);
    ti_ = 0;
    return true;
  }
  const Tok& Peek() const { return toks_[ti_]; }
  Tok Next() {
    Tok t = toks_[ti_];
    if (ti_ + 1 < toks_.size()) ++ti_;
    return t;
  }
  bool IsOp(absl::string_view op) const {
    return Peek().kind == Tok::Kind::kOp && Peek().text == op;
  }
  bool IsName(absl::string_view name) const {
    return Peek().kind == Tok::Kind::kName && Peek().text == name;
  }
  bool Accept(absl::string_view op) {
    if (!IsOp(op)) return false;
    Next();
    return true;
  }
  void Expect(absl::string_view op) {
    if (!Accept(op)) {
      Fail(line_, absl::StrCat("expected '", std::string(op), "'",
                               Peek().kind == Tok::Kind::kEnd
                                   ? std::string(" at the end")
                                   : absl::StrCat(" before '", Peek().text, "'")));
    }
  }
  std::string ExpectName() {
    if (Peek().kind != Tok::Kind::kName) {
      Fail(line_, "expected a name");
      return "";
    }
    return Next().text;
  }
  void ExpectEnd() {
    if (status_.ok() && Peek().kind != Tok::Kind::kEnd) {
      Fail(line_, absl::StrCat("unexpected '", Peek().text, "' (unsupported syntax?)"));
    }
  }
  bool Deeper() {
    if (++depth_ > kMaxDepth) {
      Fail(line_, "expression nested too deeply");
      return false;
    }
    return true;
  }
  ExprPtr MakeExpr(Expr::Kind kind) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line_;
    return e;
  }
  void Fail(int line, const std::string& what) {
    if (status_.ok()) {
      status_ = absl::InvalidArgumentError(absl::StrCat("chat template line ", line, ": ", what));
    }
    ti_ = toks_.empty() ? 0 : toks_.size() - 1;  // stop consuming
  }

  std::vector<Chunk> chunks_;
  size_t ci_ = 0;
  std::vector<Tok> toks_{Tok{}};
  size_t ti_ = 0;
  int line_ = 1;
  int depth_ = 0;
  absl::Status status_;
};

}  // namespace

Template::Template() = default;
Template::~Template() = default;

absl::StatusOr<std::unique_ptr<Template>> Template::Parse(absl::string_view source) {
  auto chunks = Lex(NormalizeNewlines(source));
  if (!chunks.ok()) return chunks.status();
  auto body = Parser(*std::move(chunks)).Run();
  if (!body.ok()) return body.status();
  auto t = std::unique_ptr<Template>(new Template());
  t->body_ = *std::move(body);
  return t;
}

}  // namespace kimi::tokenizer::jinja
