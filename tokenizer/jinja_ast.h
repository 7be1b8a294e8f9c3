// Syntax tree of the Jinja subset (private to tokenizer/).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja_value.h"

namespace kimi::tokenizer::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,  // literal
    kName,     // name
    kAttr,     // args[0].name
    kIndex,    // args[0][args[1]]
    kSlice,    // args[0][args[1]:args[2]:args[3]] (null = omitted)
    kCall,     // args[0](args[1..], kwargs)
    kFilter,   // args[0] | name(args[1..], kwargs)
    kTest,     // args[0] is [not] name(args[1..])
    kUnary,    // name: "not" | "-"
    kBinary,   // name: operator; args[0], args[1]
    kCompare,  // args[0] ops[0] args[1] ops[1] args[2] ...: a chain, as Python's a < b < c
    kCond,     // args[0] if args[1] else args[2] (args[2] may be null)
    kList,     // [args...] (also tuples)
    kDict,     // {kwargs...}: keys are expressions in args (even), values (odd)
  };
  Kind kind = Kind::kLiteral;
  int line = 0;
  Value literal;
  std::string name;
  std::vector<std::string> ops;  // kCompare
  bool negated = false;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
};

struct Node {
  enum class Kind { kText, kOutput, kIf, kFor, kSet, kBreak, kContinue };
  Kind kind = Kind::kText;
  int line = 0;
  std::string text;                                             // kText
  ExprPtr expr;                                                 // kOutput, kFor (iterable), kSet
  ExprPtr filter;                                               // kFor: `if cond`, or null
  std::vector<std::pair<ExprPtr, std::vector<Node>>> branches;  // kIf
  std::vector<Node> body;                                       // kFor
  std::vector<Node> else_body;                                  // kIf, kFor
  std::vector<std::string> vars;                                // kFor: 1 or 2 names
  std::string target, target_attr;                              // kSet
};

}  // namespace kimi::tokenizer::jinja
