// SPDX-License-Identifier: Apache-2.0
// The parsed form of a template (jinja.h): jinja_parse.cpp builds it (lexing, whitespace control,
// recursive-descent parsing with jinja2's precedence), jinja.cpp evaluates it. Internal.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/result.h"
#include "model/tokenizer/jinja_value.h"

namespace ferry::model::jinja {

struct Expr {
  enum class Kind : unsigned char {
    kLiteral,    // value
    kName,       // name
    kAttr,       // a[0].name
    kIndex,      // a[0][a[1]]
    kSlice,      // a[0][a[1]:a[2]:a[3]] (null parts: absent)
    kCall,       // a[0](a[1..]) with kwargs
    kFilter,     // a[0] | name(a[1..], kwargs)
    kTest,       // a[0] is [not] name(a[1..])
    kUnary,      // op a[0]: "-", "+", "not"
    kBinary,     // a[0] op a[1]: + - * / // % ~ ** and or in "not in"
    kCompare,    // a[0] ops[i] a[i+1] ... (chained as Python)
    kCondition,  // a[1] if a[0] else a[2] (a[2] null: undefined)
    kList,       // [a...]
    kDict,       // {keys[i]: a[i]}
  };
  Kind kind = Kind::kLiteral;
  Value value;
  std::string name;      // kName, kAttr, kFilter, kTest, kUnary/kBinary op
  bool negated = false;  // kTest
  std::vector<std::unique_ptr<Expr>> a;
  std::vector<std::string> ops;   // kCompare
  std::vector<std::string> keys;  // kCall / kFilter kwargs names (parallel to the tail of a)
  int line = 0;
};

struct Node {
  enum class Kind : unsigned char { kBody, kText, kOutput, kFor, kIf, kSet, kBreak, kContinue };
  Kind kind = Kind::kBody;
  std::string text;                          // kText
  std::unique_ptr<Expr> expr;                // kOutput, kFor (iterable), kSet (value)
  std::unique_ptr<Expr> filter;              // kFor: `for x in y if cond`
  std::vector<std::string> targets;          // kFor loop variables; kSet: {name} or {ns, attr}
  std::vector<std::unique_ptr<Expr>> conds;  // kIf: one per branch (else: none)
  std::vector<std::unique_ptr<Node>> body;   // kBody: statements; kFor: {body, else}; kIf: branches
  int line = 0;
};

Result<std::unique_ptr<Node>> parse_template(std::string_view source);

}  // namespace ferry::model::jinja
