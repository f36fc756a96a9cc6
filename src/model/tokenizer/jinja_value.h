// SPDX-License-Identifier: Apache-2.0
// The values of ferry's Jinja subset (jinja.h): Python's none / bool / int / float / str / list /
// dict as Jinja templates see them, plus undefined (a missing name or key) and namespace (the one
// mutable object, `namespace(...)` with `{% set ns.x = ... %}`). Lists and dicts are shared
// (copying a Value copies a pointer), as Python objects are. Rendering follows Python:
// str(None) = "None", str(True) = "True", floats as repr, lists and dicts as their repr;
// to_json is transformers' `tojson` (json.dumps, ensure_ascii=False, ", " and ": ").
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/json.h"

namespace ferry::model::jinja {

class Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;  // insertion order, as Python's dict

class Value {
 public:
  enum class Kind : std::uint8_t { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict };

  Value() = default;  // undefined
  static Value none();
  Value(bool b);  // NOLINT(google-explicit-constructor): literals read naturally
  Value(std::int64_t i);
  Value(int i) : Value(static_cast<std::int64_t>(i)) {}
  Value(double d);
  Value(std::string s);
  Value(const char* s) : Value(std::string(s)) {}
  static Value list(List items = {});
  static Value dict(Dict items = {}, bool is_namespace = false);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  bool is_namespace() const { return kind_ == Kind::kDict && ns_; }

  bool as_bool() const { return b_; }
  std::int64_t as_int() const { return i_; }
  double as_number() const { return kind_ == Kind::kInt ? double(i_) : d_; }
  const std::string& as_string() const { return s_; }
  List& items() const { return *list_; }    // kList
  Dict& entries() const { return *dict_; }  // kDict

  // Python truthiness (undefined is false).
  bool truthy() const;
  // A dict entry (nullptr when absent).
  const Value* find(const std::string& key) const;
  void set(const std::string& key, Value v) const;  // kDict: insert or replace
  // What {{ v }} writes: str(v) (undefined: "").
  std::string str() const;
  // Python's repr (strings quoted) for list and dict rendering.
  std::string repr() const;
  // json.dumps(v, ensure_ascii=False); indent < 0: one line.
  std::string to_json(int indent = -1) const;
  // Python ==.
  bool equals(const Value& o) const;
  const char* type_name() const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  bool ns_ = false;
  std::int64_t i_ = 0;
  double d_ = 0;
  std::string s_;
  std::shared_ptr<List> list_;
  std::shared_ptr<Dict> dict_;
  void json_into(std::string& out, int indent, int depth) const;
};

// A JSON document as template values (null is none); ordered_json so that objects keep their key
// order, as Python's dicts (tojson writes them in that order).
Value value_from_json(const nlohmann::ordered_json& j);

}  // namespace ferry::model::jinja
