// SPDX-License-Identifier: Apache-2.0
#include "model/tokenizer/jinja_value.h"

#include <charconv>
#include <cmath>
#include <cstdio>

namespace ferry::model::jinja {

Value Value::none() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}
Value::Value(bool b) : kind_(Kind::kBool), b_(b) {}
Value::Value(std::int64_t i) : kind_(Kind::kInt), i_(i) {}
Value::Value(double d) : kind_(Kind::kFloat), d_(d) {}
Value::Value(std::string s) : kind_(Kind::kString), s_(std::move(s)) {}

Value Value::list(List items) {
  Value v;
  v.kind_ = Kind::kList;
  v.list_ = std::make_shared<List>(std::move(items));
  return v;
}

Value Value::dict(Dict items, bool is_namespace) {
  Value v;
  v.kind_ = Kind::kDict;
  v.ns_ = is_namespace;
  v.dict_ = std::make_shared<Dict>(std::move(items));
  return v;
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return b_;
    case Kind::kInt:
      return i_ != 0;
    case Kind::kFloat:
      return d_ != 0.0;
    case Kind::kString:
      return !s_.empty();
    case Kind::kList:
      return !list_->empty();
    case Kind::kDict:
      return ns_ || !dict_->empty();
  }
  return false;
}

const Value* Value::find(const std::string& key) const {
  if (kind_ != Kind::kDict) return nullptr;
  for (const auto& [k, v] : *dict_) {
    if (k == key) return &v;
  }
  return nullptr;
}

void Value::set(const std::string& key, Value v) const {
  for (auto& [k, old] : *dict_) {
    if (k == key) {
      old = std::move(v);
      return;
    }
  }
  dict_->emplace_back(key, std::move(v));
}

namespace {

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, d);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

// Python's repr of a str: single quotes unless the text has one and no double quote.
std::string str_repr(const std::string& s) {
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (const char c : s) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c == q) out += '\\';
        out += c;
    }
  }
  out += q;
  return out;
}

void json_string(const std::string& s, std::string& out) {
  out += '"';
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += ch;  // ensure_ascii=False: UTF-8 passes through
        }
    }
  }
  out += '"';
}

}  // namespace

std::string Value::str() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kString:
      return s_;
    default:
      return repr();
  }
}

std::string Value::repr() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return b_ ? "True" : "False";
    case Kind::kInt:
      return std::to_string(i_);
    case Kind::kFloat:
      return float_repr(d_);
    case Kind::kString:
      return str_repr(s_);
    case Kind::kList: {
      std::string out = "[";
      for (std::size_t i = 0; i < list_->size(); ++i) {
        if (i) out += ", ";
        out += (*list_)[i].repr();
      }
      return out + "]";
    }
    case Kind::kDict: {
      std::string out = ns_ ? "<Namespace {" : "{";
      for (std::size_t i = 0; i < dict_->size(); ++i) {
        if (i) out += ", ";
        out += str_repr((*dict_)[i].first) + ": " + (*dict_)[i].second.repr();
      }
      return out + (ns_ ? "}>" : "}");
    }
  }
  return "";
}

void Value::json_into(std::string& out, int indent, int depth) const {
  auto newline = [&](int d) {
    if (indent < 0) return;
    out += '\n';
    out.append(std::size_t(indent * d), ' ');
  };
  const char* sep = indent < 0 ? ", " : ",";
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      out += "null";
      return;
    case Kind::kBool:
      out += b_ ? "true" : "false";
      return;
    case Kind::kInt:
      out += std::to_string(i_);
      return;
    case Kind::kFloat:
      out += std::isnan(d_)   ? "NaN"
             : std::isinf(d_) ? (d_ > 0 ? "Infinity" : "-Infinity")
                              : float_repr(d_);
      return;
    case Kind::kString:
      json_string(s_, out);
      return;
    case Kind::kList:
      out += '[';
      for (std::size_t i = 0; i < list_->size(); ++i) {
        if (i) out += sep;
        newline(depth + 1);
        (*list_)[i].json_into(out, indent, depth + 1);
      }
      if (!list_->empty()) newline(depth);
      out += ']';
      return;
    case Kind::kDict:
      out += '{';
      for (std::size_t i = 0; i < dict_->size(); ++i) {
        if (i) out += sep;
        newline(depth + 1);
        json_string((*dict_)[i].first, out);
        out += ": ";
        (*dict_)[i].second.json_into(out, indent, depth + 1);
      }
      if (!dict_->empty()) newline(depth);
      out += '}';
      return;
  }
}

std::string Value::to_json(int indent) const {
  std::string out;
  json_into(out, indent, 0);
  return out;
}

bool Value::equals(const Value& o) const {
  if (is_number() && o.is_number()) {
    if (kind_ == Kind::kInt && o.kind_ == Kind::kInt) return i_ == o.i_;
    return as_number() == o.as_number();
  }
  if (kind_ == Kind::kBool && o.is_number()) return Value(std::int64_t(b_)).equals(o);
  if (is_number() && o.kind_ == Kind::kBool) return equals(Value(std::int64_t(o.b_)));
  if (kind_ != o.kind_) return false;
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kBool:
      return b_ == o.b_;
    case Kind::kString:
      return s_ == o.s_;
    case Kind::kList:
      if (list_->size() != o.list_->size()) return false;
      for (std::size_t i = 0; i < list_->size(); ++i) {
        if (!(*list_)[i].equals((*o.list_)[i])) return false;
      }
      return true;
    case Kind::kDict:
      if (dict_->size() != o.dict_->size()) return false;
      for (const auto& [k, v] : *dict_) {
        const Value* w = o.find(k);
        if (w == nullptr || !v.equals(*w)) return false;
      }
      return true;
    default:
      return false;
  }
}

const char* Value::type_name() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "undefined";
    case Kind::kNone:
      return "none";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return "list";
    case Kind::kDict:
      return ns_ ? "namespace" : "dict";
  }
  return "?";
}

Value value_from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::none();
    case nlohmann::ordered_json::value_t::boolean:
      return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
    case nlohmann::ordered_json::value_t::number_unsigned:
      return Value(j.get<std::int64_t>());
    case nlohmann::ordered_json::value_t::number_float:
      return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List l;
      for (const auto& x : j) l.push_back(value_from_json(x));
      return Value::list(std::move(l));
    }
    case nlohmann::ordered_json::value_t::object: {
      Dict d;
      for (const auto& [k, v] : j.items()) d.emplace_back(k, value_from_json(v));
      return Value::dict(std::move(d));
    }
    default:
      return Value();
  }
}

}  // namespace ferry::model::jinja
