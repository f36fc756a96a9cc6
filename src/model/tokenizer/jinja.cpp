// SPDX-License-Identifier: Apache-2.0
// Evaluation of the Jinja subset (jinja.h) over the tree jinja_parse.cpp builds. Python's
// semantics where templates can see them: and/or return an operand, `in` is substring / element
// / key, // and % floor, negative indices and slices count from the end, a missing dict key is
// undefined (renders "", iterates as nothing, is falsy) while an attribute of undefined is an
// error (jinja2's default Undefined). String lengths, indices and slices count code points.
// Errors are thrown as RenderError inside this file and returned by render() as a Status.
#include "model/tokenizer/jinja.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <ctime>

#include "model/tokenizer/jinja_parse.h"

namespace ferry::model::jinja {
namespace {

struct RenderError {
  std::string message;
};

// Bounds on what a (model-supplied) template may make: a chat prompt is far below all of them.
constexpr std::size_t kMaxOutputBytes = 64u << 20;
constexpr std::int64_t kMaxRange = 1 << 20;
constexpr std::int64_t kMaxIterations = 1 << 24;

[[noreturn]] void fail(int line, const std::string& what) {
  throw RenderError{"jinja: line " + std::to_string(line) + ": " + what};
}

// Code point boundaries of a UTF-8 string (its "characters" for len, index and slice).
std::vector<std::size_t> char_starts(const std::string& s) {
  std::vector<std::size_t> at;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) at.push_back(i);
  }
  return at;
}

std::string python_strip(const std::string& s, const std::string* chars, bool left, bool right) {
  auto strip_this = [&](char c) {
    return chars ? chars->find(c) != std::string::npos
                 : (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v');
  };
  std::size_t a = 0, b = s.size();
  if (left) {
    while (a < b && strip_this(s[a])) ++a;
  }
  if (right) {
    while (b > a && strip_this(s[b - 1])) --b;
  }
  return s.substr(a, b - a);
}

std::string ascii_case(std::string s, bool upper) {
  for (char& c : s) {
    c = static_cast<char>(upper ? std::toupper(static_cast<unsigned char>(c))
                                : std::tolower(static_cast<unsigned char>(c)));
  }
  return s;
}

Value python_split(const std::string& s, const Value* sep, std::int64_t maxsplit) {
  List out;
  if (sep == nullptr || sep->is_none()) {  // runs of whitespace, no empty parts
    std::size_t i = 0;
    while (i < s.size()) {
      while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
      if (i >= s.size()) break;
      if (maxsplit >= 0 && std::int64_t(out.size()) == maxsplit) {
        out.emplace_back(python_strip(s.substr(i), nullptr, false, true));
        break;
      }
      std::size_t j = i;
      while (j < s.size() && !std::isspace(static_cast<unsigned char>(s[j]))) ++j;
      out.emplace_back(s.substr(i, j - i));
      i = j;
    }
    return Value::list(std::move(out));
  }
  const std::string& d = sep->as_string();
  if (d.empty()) throw RenderError{"jinja: split with an empty separator"};
  std::size_t i = 0;
  for (;;) {
    const std::size_t j = s.find(d, i);
    if (j == std::string::npos || (maxsplit >= 0 && std::int64_t(out.size()) == maxsplit)) {
      out.emplace_back(s.substr(i));
      break;
    }
    out.emplace_back(s.substr(i, j - i));
    i = j + d.size();
  }
  return Value::list(std::move(out));
}

std::string replace_all(std::string s, const std::string& from, const std::string& to,
                        std::int64_t count) {
  if (from.empty()) return s;
  std::size_t i = 0;
  for (std::int64_t n = 0; count < 0 || n < count; ++n) {
    i = s.find(from, i);
    if (i == std::string::npos) break;
    s.replace(i, from.size(), to);
    i += to.size();
  }
  return s;
}

class Renderer {
 public:
  explicit Renderer(const Dict& vars) { scopes_.push_back(vars); }

  void run(const Node& n) { exec_body(n.body); }
  std::string take() { return std::move(out_); }

 private:
  enum class Flow : unsigned char { kNormal, kBreak, kContinue };

  // --- statements ---
  Flow exec_body(const std::vector<std::unique_ptr<Node>>& body) {
    for (const auto& n : body) {
      const Flow f = exec(*n);
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }
  Flow exec(const Node& n) {
    switch (n.kind) {
      case Node::Kind::kBody:
        return exec_body(n.body);
      case Node::Kind::kText:
        emit(n.text, n.line);
        return Flow::kNormal;
      case Node::Kind::kOutput:
        emit(eval(*n.expr).str(), n.line);
        return Flow::kNormal;
      case Node::Kind::kIf:
        for (std::size_t b = 0; b < n.body.size(); ++b) {
          if (b >= n.conds.size() || eval(*n.conds[b]).truthy()) return exec_body(n.body[b]->body);
        }
        return Flow::kNormal;
      case Node::Kind::kSet: {
        Value v = eval(*n.expr);
        if (n.targets.size() == 1) {
          scopes_.back().emplace_back(n.targets[0], std::move(v));  // lookup takes the last
        } else {
          const Value ns = lookup(n.targets[0]);
          if (!ns.is_namespace()) fail(n.line, "'" + n.targets[0] + "' is not a namespace");
          ns.set(n.targets[1], std::move(v));
        }
        return Flow::kNormal;
      }
      case Node::Kind::kBreak:
        return Flow::kBreak;
      case Node::Kind::kContinue:
        return Flow::kContinue;
      case Node::Kind::kFor:
        exec_for(n);
        return Flow::kNormal;
    }
    return Flow::kNormal;
  }
  void emit(const std::string& s, int line) {
    if (out_.size() + s.size() > kMaxOutputBytes) fail(line, "the rendered text exceeds 64 MiB");
    out_ += s;
  }
  void exec_for(const Node& n) {
    const List items = iterate(eval(*n.expr), n.line);
    // `for x in y if c`: the filter sees each item (loop.* counts the kept ones, as jinja2).
    std::vector<Value> kept;
    for (const Value& it : items) {
      if (n.filter) {
        scopes_.emplace_back();
        bind(n, it);
        const bool keep = eval(*n.filter).truthy();
        scopes_.pop_back();
        if (!keep) continue;
      }
      kept.push_back(it);
    }
    if (kept.empty()) {
      if (n.body.size() > 1) exec_body(n.body[1]->body);
      return;
    }
    const auto len = static_cast<std::int64_t>(kept.size());
    for (std::int64_t i = 0; i < len; ++i) {
      if (++iterations_ > kMaxIterations) fail(n.line, "more than 2^24 loop iterations");
      scopes_.emplace_back();
      bind(n, kept[std::size_t(i)]);
      Dict loop = {{"index", Value(i + 1)},      {"index0", Value(i)},
                   {"revindex", Value(len - i)}, {"revindex0", Value(len - i - 1)},
                   {"first", Value(i == 0)},     {"last", Value(i == len - 1)},
                   {"length", Value(len)}};
      if (i > 0) loop.emplace_back("previtem", kept[std::size_t(i - 1)]);
      if (i + 1 < len) loop.emplace_back("nextitem", kept[std::size_t(i + 1)]);
      scopes_.back().emplace_back("loop", Value::dict(std::move(loop)));
      const Flow f = exec_body(n.body[0]->body);
      scopes_.pop_back();
      if (f == Flow::kBreak) break;
    }
  }
  void bind(const Node& n, const Value& item) {
    if (n.targets.size() == 1) {
      scopes_.back().emplace_back(n.targets[0], item);
      return;
    }
    const List parts = iterate(item, n.line);
    if (parts.size() != n.targets.size()) {
      fail(n.line, "cannot unpack " + std::to_string(parts.size()) + " values into " +
                       std::to_string(n.targets.size()));
    }
    for (std::size_t k = 0; k < parts.size(); ++k)
      scopes_.back().emplace_back(n.targets[k], parts[k]);
  }

  // --- values ---
  Value lookup(const std::string& name) const {
    for (auto s = scopes_.rbegin(); s != scopes_.rend(); ++s) {
      for (auto it = s->rbegin(); it != s->rend(); ++it) {
        if (it->first == name) return it->second;
      }
    }
    return Value();
  }
  static List iterate(const Value& v, int line) {
    switch (v.kind()) {
      case Value::Kind::kUndefined:
        return {};
      case Value::Kind::kList:
        return v.items();
      case Value::Kind::kDict: {
        List keys;
        for (const auto& [k, x] : v.entries()) keys.emplace_back(k);
        return keys;
      }
      case Value::Kind::kString: {
        List chars;
        const std::string& s = v.as_string();
        const auto at = char_starts(s);
        for (std::size_t i = 0; i < at.size(); ++i) {
          chars.emplace_back(s.substr(at[i], (i + 1 < at.size() ? at[i + 1] : s.size()) - at[i]));
        }
        return chars;
      }
      default:
        fail(line, std::string("'") + v.type_name() + "' is not iterable");
    }
  }
  static std::int64_t length(const Value& v, int line) {
    switch (v.kind()) {
      case Value::Kind::kUndefined:
        return 0;
      case Value::Kind::kString:
        return std::int64_t(char_starts(v.as_string()).size());
      case Value::Kind::kList:
        return std::int64_t(v.items().size());
      case Value::Kind::kDict:
        return std::int64_t(v.entries().size());
      default:
        fail(line, std::string("object of type '") + v.type_name() + "' has no len()");
    }
  }
  static Value item(const Value& obj, const Value& key, int line, const std::string& what) {
    if (obj.is_undefined()) fail(line, "'" + what + "' is undefined");
    if (obj.is_dict()) {
      if (!key.is_string()) return Value();
      const Value* v = obj.find(key.as_string());
      return v ? *v : Value();
    }
    if ((obj.is_list() || obj.is_string()) && key.kind() == Value::Kind::kInt) {
      // A list is indexed in place (messages[i] inside a loop must not copy the list); a
      // string by its characters.
      const List chars = obj.is_string() ? iterate(obj, line) : List();
      const List& seq = obj.is_list() ? obj.items() : chars;
      std::int64_t i = key.as_int();
      if (i < 0) i += std::int64_t(seq.size());
      if (i < 0 || i >= std::int64_t(seq.size())) return Value();  // jinja2: undefined
      return seq[std::size_t(i)];
    }
    return Value();
  }
  static Value slice(const Value& obj, const Value& a, const Value& b, const Value& c, int line) {
    const List chars = obj.is_list() ? List() : iterate(obj, line);
    const List& seq = obj.is_list() ? obj.items() : chars;
    const auto n = static_cast<std::int64_t>(seq.size());
    const std::int64_t step = c.is_undefined() || c.is_none() ? 1 : c.as_int();
    if (step == 0) fail(line, "slice step cannot be zero");
    auto bound = [&](const Value& v, std::int64_t dflt) {
      if (v.is_undefined() || v.is_none()) return dflt;
      std::int64_t i = v.as_int();
      if (i < 0) i += n;
      return step > 0 ? std::clamp<std::int64_t>(i, 0, n) : std::clamp<std::int64_t>(i, -1, n - 1);
    };
    const std::int64_t lo = bound(a, step > 0 ? 0 : n - 1), hi = bound(b, step > 0 ? n : -1);
    List out;
    for (std::int64_t i = lo; step > 0 ? i < hi : i > hi;) {
      out.push_back(seq[std::size_t(i)]);
      if (__builtin_add_overflow(i, step, &i)) break;
    }
    if (!obj.is_string()) return Value::list(std::move(out));
    std::string s;
    for (const Value& ch : out) s += ch.as_string();
    return Value(std::move(s));
  }

  Value eval(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.value;
      case Expr::Kind::kName:
        return lookup(e.name);
      case Expr::Kind::kAttr: {
        const Value obj = eval(*e.a[0]);
        if (obj.is_undefined()) fail(e.line, "'" + describe(*e.a[0]) + "' is undefined");
        if (obj.is_dict()) {
          const Value* v = obj.find(e.name);
          return v ? *v : Value();
        }
        return Value();  // methods are resolved at the call
      }
      case Expr::Kind::kIndex:
        return item(eval(*e.a[0]), eval(*e.a[1]), e.line, describe(*e.a[0]));
      case Expr::Kind::kSlice: {
        const Value obj = eval(*e.a[0]);
        if (obj.is_undefined()) fail(e.line, "'" + describe(*e.a[0]) + "' is undefined");
        auto part = [&](int k) {
          return e.a[std::size_t(k)] ? eval(*e.a[std::size_t(k)]) : Value();
        };
        return slice(obj, part(1), part(2), part(3), e.line);
      }
      case Expr::Kind::kCall:
        return call(e);
      case Expr::Kind::kFilter:
        return filter(e);
      case Expr::Kind::kTest: {
        const bool r = test(e);
        return Value(e.negated ? !r : r);
      }
      case Expr::Kind::kUnary: {
        const Value v = eval(*e.a[0]);
        if (e.name == "not") return Value(!v.truthy());
        if (!v.is_number()) fail(e.line, "bad operand for unary " + e.name);
        if (e.name == "+") return v;
        if (v.kind() == Value::Kind::kInt && v.as_int() != INT64_MIN) return Value(-v.as_int());
        return Value(-v.as_number());
      }
      case Expr::Kind::kBinary:
        return binary(e);
      case Expr::Kind::kCompare: {
        Value left = eval(*e.a[0]);
        for (std::size_t k = 0; k < e.ops.size(); ++k) {
          Value right = eval(*e.a[k + 1]);
          if (!compare(e.ops[k], left, right, e.line)) return Value(false);
          left = std::move(right);
        }
        return Value(true);
      }
      case Expr::Kind::kCondition:
        if (eval(*e.a[0]).truthy()) return eval(*e.a[1]);
        return e.a[2] ? eval(*e.a[2]) : Value();
      case Expr::Kind::kList: {
        List l;
        for (const auto& x : e.a) l.push_back(eval(*x));
        return Value::list(std::move(l));
      }
      case Expr::Kind::kDict: {
        Dict d;
        for (std::size_t k = 0; k < e.keys.size(); ++k) d.emplace_back(e.keys[k], eval(*e.a[k]));
        return Value::dict(std::move(d));
      }
    }
    return Value();
  }
  static std::string describe(const Expr& e) {
    if (e.kind == Expr::Kind::kName) return e.name;
    if (e.kind == Expr::Kind::kAttr) return describe(*e.a[0]) + "." + e.name;
    return "value";
  }

  bool compare(const std::string& op, const Value& l, const Value& r, int line) {
    if (op == "==") return l.equals(r);
    if (op == "!=") return !l.equals(r);
    if (op == "in" || op == "not in") {
      bool found = false;
      if (r.is_string()) {
        if (!l.is_string()) fail(line, "'in <string>' needs a string on the left");
        found = r.as_string().find(l.as_string()) != std::string::npos;
      } else if (r.is_list()) {
        for (const Value& x : r.items()) found = found || x.equals(l);
      } else if (r.is_dict()) {
        found = l.is_string() && r.find(l.as_string()) != nullptr;
      } else if (!r.is_undefined()) {
        fail(line, std::string("argument of type '") + r.type_name() + "' is not iterable");
      }
      return op == "in" ? found : !found;
    }
    int c = 0;
    if (l.is_number() && r.is_number()) {
      c = l.as_number() < r.as_number() ? -1 : l.as_number() > r.as_number() ? 1 : 0;
    } else if (l.is_string() && r.is_string()) {
      c = l.as_string().compare(r.as_string());
    } else {
      fail(line, std::string("'") + op + "' not supported between '" + l.type_name() + "' and '" +
                     r.type_name() + "'");
    }
    if (op == "<") return c < 0;
    if (op == "<=") return c <= 0;
    if (op == ">") return c > 0;
    return c >= 0;  // >=
  }

  Value binary(const Expr& e) {
    const std::string& op = e.name;
    if (op == "and") {
      Value l = eval(*e.a[0]);
      return l.truthy() ? eval(*e.a[1]) : l;
    }
    if (op == "or") {
      Value l = eval(*e.a[0]);
      return l.truthy() ? l : eval(*e.a[1]);
    }
    const Value l = eval(*e.a[0]), r = eval(*e.a[1]);
    if (op == "~") return Value(l.str() + r.str());
    if (op == "+") {
      if (l.is_string() && r.is_string()) return Value(l.as_string() + r.as_string());
      if (l.is_list() && r.is_list()) {
        List out = l.items();
        out.insert(out.end(), r.items().begin(), r.items().end());
        return Value::list(std::move(out));
      }
    }
    if (op == "*" && ((l.is_string() && r.kind() == Value::Kind::kInt) ||
                      (l.kind() == Value::Kind::kInt && r.is_string()))) {
      const std::string& s = l.is_string() ? l.as_string() : r.as_string();
      const std::int64_t times = l.is_string() ? r.as_int() : l.as_int();
      if (times > 0 && double(s.size()) * double(times) > double(kMaxOutputBytes)) {
        fail(e.line, "a string repeated past 64 MiB");
      }
      std::string out;
      for (std::int64_t k = 0; k < times; ++k) out += s;
      return Value(std::move(out));
    }
    if (!l.is_number() || !r.is_number()) {
      fail(e.line, "unsupported operand types for " + op + ": '" + l.type_name() + "' and '" +
                       r.type_name() + "'");
    }
    const bool ints = l.kind() == Value::Kind::kInt && r.kind() == Value::Kind::kInt;
    const double x = l.as_number(), y = r.as_number();
    if (op == "/") {
      if (y == 0) fail(e.line, "division by zero");
      return Value(x / y);
    }
    if (op == "//" || op == "%") {
      if (y == 0) fail(e.line, "division by zero");
      if (ints && !(l.as_int() == INT64_MIN && r.as_int() == -1)) {
        const std::int64_t a = l.as_int(), b = r.as_int();
        std::int64_t q = a / b, m = a % b;
        if (m != 0 && ((m < 0) != (b < 0))) {
          --q;
          m += b;
        }
        return op == "//" ? Value(q) : Value(m);
      }
      const double q = std::floor(x / y);
      return op == "//" ? Value(q) : Value(x - q * y);
    }
    if (op == "**") {
      if (ints && r.as_int() >= 0 && r.as_int() <= 64) {
        std::int64_t p = 1;
        bool over = false;
        for (std::int64_t k = 0; k < r.as_int() && !over; ++k) {
          over = __builtin_mul_overflow(p, l.as_int(), &p);
        }
        if (!over) return Value(p);
      }
      return Value(std::pow(x, y));
    }
    if (ints) {  // past int64 (Python would go on exactly): the float result
      std::int64_t v = 0;
      bool over = false;
      if (op == "+") over = __builtin_add_overflow(l.as_int(), r.as_int(), &v);
      if (op == "-") over = __builtin_sub_overflow(l.as_int(), r.as_int(), &v);
      if (op == "*") over = __builtin_mul_overflow(l.as_int(), r.as_int(), &v);
      if (!over) return Value(v);
    }
    if (op == "+") return Value(x + y);
    if (op == "-") return Value(x - y);
    return Value(x * y);  // *
  }

  // Arguments of a call, filter or test: positional (from `first` on) and keyword.
  struct Args {
    List pos;
    Dict kw;
    const Value* get(std::size_t i, const char* name) const {
      if (i < pos.size()) return &pos[i];
      for (const auto& [k, v] : kw) {
        if (k == name) return &v;
      }
      return nullptr;
    }
  };
  Args args_of(const Expr& e, std::size_t first) {
    Args a;
    const std::size_t npos = e.a.size() - e.keys.size();
    for (std::size_t k = first; k < npos; ++k) a.pos.push_back(eval(*e.a[k]));
    for (std::size_t k = 0; k < e.keys.size(); ++k)
      a.kw.emplace_back(e.keys[k], eval(*e.a[npos + k]));
    return a;
  }

  Value call(const Expr& e) {
    const Expr& callee = *e.a[0];
    Args a = args_of(e, 1);
    if (callee.kind == Expr::Kind::kName && lookup(callee.name).is_undefined()) {
      return global(callee.name, a, e.line);
    }
    if (callee.kind == Expr::Kind::kAttr) {
      const Value self = eval(*callee.a[0]);
      if (self.is_undefined()) fail(e.line, "'" + describe(*callee.a[0]) + "' is undefined");
      return method(self, callee.name, a, e.line);
    }
    fail(e.line, "'" + describe(callee) + "' is not callable");
  }
  Value global(const std::string& name, const Args& a, int line) {
    if (name == "raise_exception") {
      throw RenderError{a.pos.empty() ? std::string("raise_exception") : a.pos[0].str()};
    }
    if (name == "namespace" || name == "dict") {
      Dict d = a.kw;
      return Value::dict(std::move(d), name == "namespace");
    }
    if (name == "range") {
      std::int64_t lo = 0, hi = 0, step = 1;
      if (a.pos.size() == 1) {
        hi = a.pos[0].as_int();
      } else if (a.pos.size() >= 2) {
        lo = a.pos[0].as_int();
        hi = a.pos[1].as_int();
        if (a.pos.size() > 2) step = a.pos[2].as_int();
      }
      if (step == 0) fail(line, "range() step must not be zero");
      const double count = (double(hi) - double(lo)) / double(step);
      if (count > double(kMaxRange)) fail(line, "range() of more than 2^20 numbers");
      List out;
      for (std::int64_t i = lo; step > 0 ? i < hi : i > hi;) {
        out.emplace_back(i);
        if (__builtin_add_overflow(i, step, &i)) break;
      }
      return Value::list(std::move(out));
    }
    if (name == "strftime_now") {  // transformers' global: the local time, strftime format
      const std::time_t now = std::time(nullptr);
      std::tm tm{};
      localtime_r(&now, &tm);
      char buf[256];
      const std::string fmt = a.pos.empty() ? std::string() : a.pos[0].str();
      const std::size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
      return Value(std::string(buf, n));
    }
    fail(line, "'" + name + "' is undefined");
  }
  Value method(const Value& self, const std::string& name, const Args& a, int line) {
    if (self.is_string()) {
      const std::string& s = self.as_string();
      const Value* x = a.get(0, "chars");
      const std::string* chars = x && x->is_string() ? &x->as_string() : nullptr;
      if (name == "strip") return Value(python_strip(s, chars, true, true));
      if (name == "lstrip") return Value(python_strip(s, chars, true, false));
      if (name == "rstrip") return Value(python_strip(s, chars, false, true));
      if (name == "upper") return Value(ascii_case(s, true));
      if (name == "lower") return Value(ascii_case(s, false));
      if (name == "split") {
        const Value* m = a.get(1, "maxsplit");
        return python_split(s, a.get(0, "sep"), m ? m->as_int() : -1);
      }
      if (name == "startswith" || name == "endswith") {
        const Value* p = a.get(0, "prefix");
        if (!p) fail(line, name + "() needs an argument");
        List options = p->is_list() ? p->items() : List{*p};
        for (const Value& o : options) {
          const std::string& t = o.as_string();
          const bool hit =
              name == "startswith"
                  ? s.compare(0, t.size(), t) == 0
                  : s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0;
          if (hit) return Value(true);
        }
        return Value(false);
      }
      if (name == "replace") {
        const Value* c = a.get(2, "count");
        if (a.pos.size() < 2) fail(line, "replace() needs two arguments");
        return Value(replace_all(s, a.pos[0].str(), a.pos[1].str(), c ? c->as_int() : -1));
      }
      if (name == "find") {
        const std::size_t i = s.find(a.pos.empty() ? std::string() : a.pos[0].str());
        return Value(i == std::string::npos ? std::int64_t(-1)
                                            : std::int64_t(char_starts(s.substr(0, i)).size()));
      }
      if (name == "title" || name == "capitalize") return filter_value(name, self, a, line);
    }
    if (self.is_dict()) {
      if (name == "items" || name == "keys" || name == "values") {
        List out;
        for (const auto& [k, v] : self.entries()) {
          if (name == "items") out.push_back(Value::list({Value(k), v}));
          if (name == "keys") out.emplace_back(k);
          if (name == "values") out.push_back(v);
        }
        return Value::list(std::move(out));
      }
      if (name == "get") {
        const Value* k = a.get(0, "key");
        const Value* v = k && k->is_string() ? self.find(k->as_string()) : nullptr;
        if (v) return *v;
        const Value* d = a.get(1, "default");
        return d ? *d : Value::none();
      }
    }
    fail(line, std::string("'") + self.type_name() + "' has no method '" + name + "'");
  }

  Value filter(const Expr& e) {
    Value v = eval(*e.a[0]);
    Args a = args_of(e, 1);
    return filter_value(e.name, v, a, e.line);
  }
  Value filter_value(const std::string& name, const Value& v, const Args& a, int line) {
    if (name == "trim") {
      const Value* c = a.get(0, "chars");
      return Value(
          python_strip(v.str(), c && c->is_string() ? &c->as_string() : nullptr, true, true));
    }
    if (name == "length" || name == "count") return Value(length(v, line));
    if (name == "string") return Value(v.str());
    if (name == "safe") return v;
    if (name == "upper" || name == "lower") return Value(ascii_case(v.str(), name == "upper"));
    if (name == "capitalize") {
      std::string s = ascii_case(v.str(), false);
      if (!s.empty()) s[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
      return Value(std::move(s));
    }
    if (name == "title") {
      std::string s = v.str();
      bool start = true;
      for (char& c : s) {
        const bool alpha = std::isalpha(static_cast<unsigned char>(c)) != 0;
        c = static_cast<char>(alpha ? (start ? std::toupper(static_cast<unsigned char>(c))
                                             : std::tolower(static_cast<unsigned char>(c)))
                                    : c);
        start = !alpha;
      }
      return Value(std::move(s));
    }
    if (name == "tojson") {  // transformers' tojson: json.dumps(ensure_ascii=False, indent=...)
      const Value* ind = a.get(0, "indent");
      return Value(v.to_json(ind && ind->kind() == Value::Kind::kInt ? int(ind->as_int()) : -1));
    }
    if (name == "default" || name == "d") {
      const Value* b = a.get(1, "boolean");
      const bool use = v.is_undefined() || (b && b->truthy() && !v.truthy());
      if (!use) return v;
      const Value* dflt = a.get(0, "default_value");
      return dflt ? *dflt : Value("");
    }
    if (name == "first" || name == "last") {
      const List seq = iterate(v, line);
      if (seq.empty()) return Value();
      return name == "first" ? seq.front() : seq.back();
    }
    if (name == "join") {
      const Value* sep = a.get(0, "d");
      std::string out;
      bool first = true;
      for (const Value& x : iterate(v, line)) {
        if (!first && sep) out += sep->str();
        out += x.str();
        first = false;
      }
      return Value(std::move(out));
    }
    if (name == "list") return Value::list(iterate(v, line));
    if (name == "reverse") {
      List seq = iterate(v, line);
      std::reverse(seq.begin(), seq.end());
      if (!v.is_string()) return Value::list(std::move(seq));
      std::string s;
      for (const Value& ch : seq) s += ch.as_string();
      return Value(std::move(s));
    }
    if (name == "items") {
      if (!v.is_dict()) fail(line, "items needs a mapping");
      return method(v, "items", {}, line);
    }
    if (name == "replace") {
      if (a.pos.size() < 2) fail(line, "replace needs two arguments");
      const Value* c = a.get(2, "count");
      return Value(replace_all(v.str(), a.pos[0].str(), a.pos[1].str(), c ? c->as_int() : -1));
    }
    if (name == "int") {
      if (v.kind() == Value::Kind::kInt) return v;
      if (v.kind() == Value::Kind::kFloat) return Value(std::int64_t(v.as_number()));
      try {
        return Value(std::int64_t(std::stoll(v.str())));
      } catch (...) {
        const Value* d = a.get(0, "default");
        return d ? *d : Value(std::int64_t(0));
      }
    }
    if (name == "float") {
      if (v.is_number()) return Value(v.as_number());
      try {
        return Value(std::stod(v.str()));
      } catch (...) {
        return Value(0.0);
      }
    }
    if (name == "abs") {
      if (v.kind() == Value::Kind::kInt && v.as_int() != INT64_MIN) {
        return Value(std::int64_t(std::llabs(v.as_int())));
      }
      if (v.is_number()) return Value(std::fabs(v.as_number()));
    }
    if (name == "selectattr" || name == "rejectattr") {  // (attribute[, test[, arg]])
      if (a.pos.empty()) fail(line, name + " needs an attribute");
      List out;
      for (const Value& x : iterate(v, line)) {
        const Value* at = x.is_dict() ? x.find(a.pos[0].str()) : nullptr;
        const Value field = at ? *at : Value();
        const bool hit = a.pos.size() < 2 ? field.truthy()
                                          : test_value(a.pos[1].str(), field,
                                                       List(a.pos.begin() + 2, a.pos.end()), line);
        if (hit == (name == "selectattr")) out.push_back(x);
      }
      return Value::list(std::move(out));
    }
    if (name == "map") {  // map(attribute='x') only
      const Value* at = a.get(99, "attribute");
      if (!at) fail(line, "map is supported with attribute= only");
      List out;
      for (const Value& x : iterate(v, line)) {
        const Value* f = x.is_dict() ? x.find(at->str()) : nullptr;
        out.push_back(f ? *f : Value());
      }
      return Value::list(std::move(out));
    }
    fail(line, "unknown filter '" + name + "'");
  }

  bool test(const Expr& e) {
    // `defined` must not fail on an attribute of a defined value that is missing.
    const Value v = eval(*e.a[0]);
    Args a = args_of(e, 1);
    return test_value(e.name, v, a.pos, e.line);
  }
  static bool test_value(const std::string& name, const Value& v, const List& args, int line) {
    if (name == "defined") return !v.is_undefined();
    if (name == "undefined") return v.is_undefined();
    if (name == "none") return v.is_none();
    if (name == "string") return v.is_string();
    if (name == "number") return v.is_number();
    if (name == "integer") return v.kind() == Value::Kind::kInt;
    if (name == "float") return v.kind() == Value::Kind::kFloat;
    if (name == "boolean") return v.kind() == Value::Kind::kBool;
    if (name == "mapping") return v.is_dict() && !v.is_namespace();
    if (name == "iterable" || name == "sequence")
      return v.is_list() || v.is_dict() || v.is_string();
    if (name == "true") return v.kind() == Value::Kind::kBool && v.as_bool();
    if (name == "false") return v.kind() == Value::Kind::kBool && !v.as_bool();
    if (name == "odd" || name == "even") {
      if (v.kind() != Value::Kind::kInt) fail(line, name + " needs an integer");
      const bool odd = (v.as_int() % 2) != 0;
      return name == "odd" ? odd : !odd;
    }
    if (name == "divisibleby") {
      if (args.empty() || args[0].as_int() == 0) fail(line, "divisibleby needs a nonzero number");
      return v.as_int() % args[0].as_int() == 0;
    }
    if (name == "equalto" || name == "eq" || name == "sameas") {
      return !args.empty() && v.equals(args[0]);
    }
    fail(line, "unknown test '" + name + "'");
  }

  std::vector<Dict> scopes_;
  std::string out_;
  std::int64_t iterations_ = 0;
};

}  // namespace

Template::Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;
Template::~Template() = default;

Result<Template> Template::parse(std::string_view source) {
  FERRY_ASSIGN_OR_RETURN(std::unique_ptr<Node> root, parse_template(source));
  Template t;
  t.root_ = std::shared_ptr<const Node>(std::move(root));
  return t;
}

Result<std::string> Template::render(const Dict& variables) const {
  Renderer r(variables);
  try {
    r.run(*root_);
  } catch (const RenderError& e) {
    return invalid_argument("{}", e.message);
  }
  return r.take();
}

}  // namespace ferry::model::jinja
