// SPDX-License-Identifier: Apache-2.0
// Lexing and parsing of the Jinja subset (jinja.h). Errors inside this file are thrown as
// ParseError and returned from parse_template() as a Status (unimplemented for a construct the
// subset leaves out, invalid_argument for a malformed template); nothing escapes it.
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <set>

#include "model/tokenizer/jinja_parse.h"

namespace ferry::model::jinja {
namespace {

struct ParseError {
  bool unsupported;
  std::string message;
};

[[noreturn]] void fail(int line, const std::string& what, bool unsupported = false) {
  throw ParseError{unsupported, "jinja: line " + std::to_string(line) + ": " + what};
}

struct Token {
  enum class Kind : unsigned char { kName, kInt, kFloat, kString, kOp } kind;
  std::string text;  // name, operator, or the decoded string
  Value value;       // numbers
};

// One piece of the template: text, or a tag with its tokens and whitespace-control flags.
struct Segment {
  enum class Kind : unsigned char { kText, kOutput, kStatement, kComment } kind;
  std::string text;
  std::vector<Token> tokens;
  bool left_minus = false, left_plus = false, right_minus = false, right_plus = false;
  int line = 1;
};

bool name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }
bool space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

class Lexer {
 public:
  explicit Lexer(std::string_view s) : s_(s) {}

  std::vector<Segment> run() {
    std::vector<Segment> out;
    while (pos_ < s_.size()) {
      const std::size_t open = find_open(pos_);
      if (open > pos_) out.push_back(text(pos_, open));
      if (open == s_.size()) break;
      out.push_back(tag(open));
    }
    return out;
  }

 private:
  std::size_t find_open(std::size_t from) const {
    for (std::size_t i = from; i + 1 < s_.size(); ++i) {
      if (s_[i] == '{' && (s_[i + 1] == '{' || s_[i + 1] == '%' || s_[i + 1] == '#')) return i;
    }
    return s_.size();
  }
  int line_at(std::size_t p) const {
    int line = 1;
    for (std::size_t i = 0; i < p; ++i) line += s_[i] == '\n';
    return line;
  }
  Segment text(std::size_t a, std::size_t b) {
    Segment seg{.kind = Segment::Kind::kText, .text = std::string(s_.substr(a, b - a))};
    seg.line = line_at(a);
    pos_ = b;
    return seg;
  }
  Segment tag(std::size_t open) {
    Segment seg;
    seg.line = line_at(open);
    const char k = s_[open + 1];
    std::size_t p = open + 2;
    if (p < s_.size() && s_[p] == '-') {
      seg.left_minus = true;
      ++p;
    } else if (p < s_.size() && s_[p] == '+') {
      seg.left_plus = true;
      ++p;
    }
    if (k == '#') {
      seg.kind = Segment::Kind::kComment;
      const std::size_t close = s_.find("#}", p);
      if (close == std::string_view::npos) fail(seg.line, "unclosed comment");
      seg.right_minus = close > p && s_[close - 1] == '-';
      seg.right_plus = close > p && s_[close - 1] == '+';
      pos_ = close + 2;
      return seg;
    }
    seg.kind = k == '{' ? Segment::Kind::kOutput : Segment::Kind::kStatement;
    const char end = k == '{' ? '}' : '%';
    int depth = 0;  // brackets open inside the tag: "}}" closes only at depth 0 (as jinja2)
    for (;;) {
      while (p < s_.size() && space(s_[p])) ++p;
      if (p >= s_.size()) fail(seg.line, "unclosed tag");
      auto closes_at = [&](std::size_t q) {
        return depth == 0 && q + 1 < s_.size() && s_[q] == end && s_[q + 1] == '}';
      };
      if ((s_[p] == '-' || s_[p] == '+') && closes_at(p + 1)) {
        (s_[p] == '-' ? seg.right_minus : seg.right_plus) = true;
        pos_ = p + 3;
        return seg;
      }
      if (closes_at(p)) {
        pos_ = p + 2;
        return seg;
      }
      p = token(p, seg, depth);
    }
  }
  std::size_t token(std::size_t p, Segment& seg, int& depth) {
    const char c = s_[p];
    if (name_start(c)) {
      std::size_t q = p;
      while (q < s_.size() && name_char(s_[q])) ++q;
      seg.tokens.push_back({Token::Kind::kName, std::string(s_.substr(p, q - p)), {}});
      return q;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      std::size_t q = p;
      while (q < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[q])) || s_[q] == '_'))
        ++q;
      bool is_float = false;
      auto digit = [&](std::size_t i) {
        return i < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i]));
      };
      if (q + 1 < s_.size() && s_[q] == '.' && digit(q + 1)) {
        is_float = true;
        ++q;
        while (digit(q)) ++q;
      }
      if (q < s_.size() && (s_[q] == 'e' || s_[q] == 'E')) {  // 2.5e3, 1e-4
        const bool sign = q + 1 < s_.size() && (s_[q + 1] == '+' || s_[q + 1] == '-');
        const std::size_t e = q + (sign ? 2 : 1);
        if (digit(e)) {
          is_float = true;
          q = e;
          while (digit(q)) ++q;
        }
      }
      std::string digits;
      for (std::size_t i = p; i < q; ++i) {
        if (s_[i] != '_') digits += s_[i];
      }
      Token t{is_float ? Token::Kind::kFloat : Token::Kind::kInt, digits, {}};
      if (is_float) {
        t.value = Value(std::strtod(digits.c_str(), nullptr));  // overflow: inf, as Python's
      } else {
        std::int64_t v = 0;
        const auto r = std::from_chars(digits.data(), digits.data() + digits.size(), v);
        if (r.ec != std::errc())
          fail(seg.line, "integer literal " + digits + " out of range", true);
        t.value = Value(v);
      }
      seg.tokens.push_back(std::move(t));
      return q;
    }
    if (c == '\'' || c == '"') {
      std::string v;
      std::size_t q = p + 1;
      for (; q < s_.size() && s_[q] != c; ++q) {
        if (s_[q] != '\\' || q + 1 >= s_.size()) {
          v += s_[q];
          continue;
        }
        const char e = s_[++q];
        switch (e) {
          case 'n':
            v += '\n';
            break;
          case 't':
            v += '\t';
            break;
          case 'r':
            v += '\r';
            break;
          case '\\':
          case '\'':
          case '"':
            v += e;
            break;
          default:  // Python keeps an unknown escape as written
            v += '\\';
            v += e;
        }
      }
      if (q >= s_.size()) fail(seg.line, "unterminated string");
      seg.tokens.push_back({Token::Kind::kString, std::move(v), {}});
      return q + 1;
    }
    static const char* const kOps[] = {"//", "**", "==", "!=", "<=", ">=", "(", ")", "[",
                                       "]",  "{",  "}",  ",",  ".",  ":",  "|", "+", "-",
                                       "*",  "/",  "%",  "~",  "<",  ">",  "="};
    for (const char* op : kOps) {
      const std::string_view o(op);
      if (s_.substr(p, o.size()) == o) {
        if (o == "(" || o == "[" || o == "{") ++depth;
        if (o == ")" || o == "]" || o == "}") --depth;
        seg.tokens.push_back({Token::Kind::kOp, std::string(o), {}});
        return p + o.size();
      }
    }
    fail(seg.line, std::string("unexpected character '") + c + "'");
  }

  std::string_view s_;
  std::size_t pos_ = 0;
};

// trim_blocks, lstrip_blocks and the - / + markers, applied to the text around each tag.
void apply_whitespace_control(std::vector<Segment>& segs) {
  for (std::size_t i = 0; i < segs.size(); ++i) {
    Segment& tag = segs[i];
    if (tag.kind == Segment::Kind::kText) continue;
    const bool block = tag.kind != Segment::Kind::kOutput;
    if (i > 0 && segs[i - 1].kind == Segment::Kind::kText) {
      std::string& prev = segs[i - 1].text;
      if (tag.left_minus) {
        while (!prev.empty() && space(prev.back())) prev.pop_back();
      } else if (block && !tag.left_plus) {
        // lstrip_blocks: spaces and tabs between the line's start and the block tag go.
        std::size_t k = prev.size();
        while (k > 0 && (prev[k - 1] == ' ' || prev[k - 1] == '\t')) --k;
        if ((k == 0 && i == 1) || (k > 0 && prev[k - 1] == '\n')) prev.resize(k);
      }
    }
    if (i + 1 < segs.size() && segs[i + 1].kind == Segment::Kind::kText) {
      std::string& next = segs[i + 1].text;
      if (tag.right_minus) {
        std::size_t k = 0;
        while (k < next.size() && space(next[k])) ++k;
        next.erase(0, k);
      } else if (block && !tag.right_plus) {
        // trim_blocks: the first newline after a block tag goes.
        if (next.rfind("\r\n", 0) == 0) {
          next.erase(0, 2);
        } else if (!next.empty() && next[0] == '\n') {
          next.erase(0, 1);
        }
      }
    }
  }
}

const std::set<std::string>& keywords() {
  static const std::set<std::string> k = {"and", "or", "not", "in", "is", "if", "else"};
  return k;
}

// Expressions of one tag's tokens, with jinja2's precedence (lowest first): conditional, or,
// and, not, comparisons and in, + -, ~, * / // %, **, unary - +, postfix (. [] ()), then filters
// and tests.
class ExprParser {
 public:
  ExprParser(const std::vector<Token>& t, std::size_t start, int line)
      : t_(t), i_(start), line_(line) {}

  std::size_t pos() const { return i_; }
  bool done() const { return i_ >= t_.size(); }
  bool at_op(std::string_view op) const {
    return !done() && t_[i_].kind == Token::Kind::kOp && t_[i_].text == op;
  }
  bool at_name(std::string_view n) const {
    return !done() && t_[i_].kind == Token::Kind::kName && t_[i_].text == n;
  }
  void expect_op(std::string_view op) {
    if (!at_op(op)) fail(line_, "expected '" + std::string(op) + "'" + here());
    ++i_;
  }
  std::string expect_name() {
    if (done() || t_[i_].kind != Token::Kind::kName) fail(line_, "expected a name" + here());
    return t_[i_++].text;
  }
  void expect_end() {
    if (!done()) fail(line_, "unexpected '" + t_[i_].text + "'");
  }

  std::unique_ptr<Expr> expression() {
    // Bounded nesting: a template is model-supplied input, and recursion must not overflow.
    if (++depth_ > kMaxDepth) fail(line_, "expression nested too deeply");
    struct Leave {
      int& d;
      ~Leave() { --d; }
    } leave{depth_};
    auto e = or_expr();
    while (at_name("if")) {
      ++i_;
      auto c = mk(Expr::Kind::kCondition);
      c->a.push_back(or_expr());
      c->a.push_back(std::move(e));
      if (at_name("else")) {
        ++i_;
        c->a.push_back(expression());
      } else {
        c->a.push_back(nullptr);
      }
      e = std::move(c);
    }
    return e;
  }
  std::unique_ptr<Expr> or_expr() {
    auto e = and_expr();
    while (at_name("or")) {
      ++i_;
      e = binary("or", std::move(e), and_expr());
    }
    return e;
  }

 private:
  std::string here() const { return done() ? " at the end" : " before '" + t_[i_].text + "'"; }
  std::unique_ptr<Expr> mk(Expr::Kind k) {
    // Chains (a + a + ..., x|f|f..., a.b.c...) are left-deep trees the evaluator recurses
    // through: the nodes of one tag are bounded like its nesting.
    if (++nodes_ > kMaxDepth * 5) fail(line_, "expression too long");
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line_;
    return e;
  }
  std::unique_ptr<Expr> binary(std::string op, std::unique_ptr<Expr> l, std::unique_ptr<Expr> r) {
    auto e = mk(Expr::Kind::kBinary);
    e->name = std::move(op);
    e->a.push_back(std::move(l));
    e->a.push_back(std::move(r));
    return e;
  }
  std::unique_ptr<Expr> and_expr() {
    auto e = not_expr();
    while (at_name("and")) {
      ++i_;
      e = binary("and", std::move(e), not_expr());
    }
    return e;
  }
  std::unique_ptr<Expr> not_expr() {
    if (at_name("not") && ++nots_ > kMaxDepth) fail(line_, "too many 'not'");
    if (at_name("not")) {
      ++i_;
      auto e = mk(Expr::Kind::kUnary);
      e->name = "not";
      e->a.push_back(not_expr());
      return e;
    }
    return compare();
  }
  std::unique_ptr<Expr> compare() {
    auto first = math1();
    std::unique_ptr<Expr> c;
    for (;;) {
      std::string op;
      if (!done() && t_[i_].kind == Token::Kind::kOp &&
          (t_[i_].text == "==" || t_[i_].text == "!=" || t_[i_].text == "<" ||
           t_[i_].text == "<=" || t_[i_].text == ">" || t_[i_].text == ">=")) {
        op = t_[i_++].text;
      } else if (at_name("in")) {
        ++i_;
        op = "in";
      } else if (at_name("not") && i_ + 1 < t_.size() && t_[i_ + 1].kind == Token::Kind::kName &&
                 t_[i_ + 1].text == "in") {
        i_ += 2;
        op = "not in";
      } else {
        break;
      }
      if (!c) {
        c = mk(Expr::Kind::kCompare);
        c->a.push_back(std::move(first));
      }
      c->ops.push_back(op);
      c->a.push_back(math1());
    }
    return c ? std::move(c) : std::move(first);
  }
  std::unique_ptr<Expr> math1() {
    auto e = concat();
    while (at_op("+") || at_op("-")) {
      const std::string op = t_[i_++].text;
      e = binary(op, std::move(e), concat());
    }
    return e;
  }
  std::unique_ptr<Expr> concat() {
    auto e = math2();
    while (at_op("~")) {
      ++i_;
      e = binary("~", std::move(e), math2());
    }
    return e;
  }
  std::unique_ptr<Expr> math2() {
    auto e = power();
    while (at_op("*") || at_op("/") || at_op("//") || at_op("%")) {
      const std::string op = t_[i_++].text;
      e = binary(op, std::move(e), power());
    }
    return e;
  }
  std::unique_ptr<Expr> power() {
    auto e = unary(true);
    while (at_op("**")) {
      ++i_;
      e = binary("**", std::move(e), unary(true));
    }
    return e;
  }
  std::unique_ptr<Expr> unary(bool with_filter) {
    std::unique_ptr<Expr> e;
    if ((at_op("-") || at_op("+")) && ++signs_ > kMaxDepth) fail(line_, "too many signs");
    if (at_op("-") || at_op("+")) {
      e = mk(Expr::Kind::kUnary);
      e->name = t_[i_++].text;
      e->a.push_back(unary(false));
    } else {
      e = primary();
    }
    e = postfix(std::move(e));
    if (with_filter) e = filters(std::move(e));
    return e;
  }
  std::unique_ptr<Expr> primary() {
    if (done()) fail(line_, "expected an expression at the end");
    const Token& tok = t_[i_];
    if (tok.kind == Token::Kind::kName) {
      if (keywords().count(tok.text))
        fail(line_, "expected an expression before '" + tok.text + "'");
      ++i_;
      auto e = mk(Expr::Kind::kLiteral);
      if (tok.text == "true" || tok.text == "True") {
        e->value = Value(true);
      } else if (tok.text == "false" || tok.text == "False") {
        e->value = Value(false);
      } else if (tok.text == "none" || tok.text == "None") {
        e->value = Value::none();
      } else {
        e->kind = Expr::Kind::kName;
        e->name = tok.text;
      }
      return e;
    }
    if (tok.kind == Token::Kind::kString) {
      std::string s;
      while (!done() && t_[i_].kind == Token::Kind::kString) s += t_[i_++].text;  // "a" "b"
      auto e = mk(Expr::Kind::kLiteral);
      e->value = Value(std::move(s));
      return e;
    }
    if (tok.kind == Token::Kind::kInt || tok.kind == Token::Kind::kFloat) {
      ++i_;
      auto e = mk(Expr::Kind::kLiteral);
      e->value = tok.value;
      return e;
    }
    if (at_op("(")) {  // parentheses, or a tuple (read as a list)
      ++i_;
      auto e = expression();
      if (at_op(",")) {
        auto l = mk(Expr::Kind::kList);
        l->a.push_back(std::move(e));
        while (at_op(",")) {
          ++i_;
          if (at_op(")")) break;
          l->a.push_back(expression());
        }
        e = std::move(l);
      }
      expect_op(")");
      return e;
    }
    if (at_op("[")) {
      ++i_;
      auto l = mk(Expr::Kind::kList);
      while (!at_op("]")) {
        l->a.push_back(expression());
        if (!at_op(",")) break;
        ++i_;
      }
      expect_op("]");
      return l;
    }
    if (at_op("{")) {
      ++i_;
      auto d = mk(Expr::Kind::kDict);
      while (!at_op("}")) {
        auto k = expression();
        if (k->kind != Expr::Kind::kLiteral || !k->value.is_string()) {
          fail(line_, "dict keys must be string literals", true);
        }
        d->keys.push_back(k->value.as_string());
        expect_op(":");
        d->a.push_back(expression());
        if (!at_op(",")) break;
        ++i_;
      }
      expect_op("}");
      return d;
    }
    fail(line_, "unexpected '" + tok.text + "'");
  }
  // (args, kwargs) of a call or filter, after its "(".
  void arguments(Expr& e) {
    while (!at_op(")")) {
      if (!done() && t_[i_].kind == Token::Kind::kName && i_ + 1 < t_.size() &&
          t_[i_ + 1].kind == Token::Kind::kOp && t_[i_ + 1].text == "=") {
        e.keys.push_back(t_[i_].text);
        i_ += 2;
        e.a.push_back(expression());
      } else {
        if (!e.keys.empty()) fail(line_, "a positional argument after a keyword one");
        e.a.push_back(expression());
      }
      if (!at_op(",")) break;
      ++i_;
    }
    expect_op(")");
  }
  std::unique_ptr<Expr> postfix(std::unique_ptr<Expr> e) {
    for (;;) {
      if (at_op(".")) {
        ++i_;
        auto a = mk(Expr::Kind::kAttr);
        a->name = expect_name();
        a->a.push_back(std::move(e));
        e = std::move(a);
      } else if (at_op("[")) {
        ++i_;
        std::unique_ptr<Expr> parts[3];
        bool slice = false;
        for (int k = 0; k < 3; ++k) {
          if (!at_op(":") && !at_op("]")) parts[k] = expression();
          if (!at_op(":") || k == 2) break;
          ++i_;
          slice = true;
        }
        expect_op("]");
        auto s = mk(slice ? Expr::Kind::kSlice : Expr::Kind::kIndex);
        s->a.push_back(std::move(e));
        if (!slice && !parts[0]) fail(line_, "empty subscript");
        for (int k = 0; k < (slice ? 3 : 1); ++k) s->a.push_back(std::move(parts[k]));
        e = std::move(s);
      } else if (at_op("(")) {
        ++i_;
        auto c = mk(Expr::Kind::kCall);
        c->a.push_back(std::move(e));
        arguments(*c);
        e = std::move(c);
      } else {
        return e;
      }
    }
  }
  std::unique_ptr<Expr> filters(std::unique_ptr<Expr> e) {
    for (;;) {
      if (at_op("|")) {
        ++i_;
        auto f = mk(Expr::Kind::kFilter);
        f->name = expect_name();
        f->a.push_back(std::move(e));
        if (at_op("(")) {
          ++i_;
          arguments(*f);
        }
        e = std::move(f);
      } else if (at_name("is")) {
        ++i_;
        auto t = mk(Expr::Kind::kTest);
        if (at_name("not")) {
          ++i_;
          t->negated = true;
        }
        t->name = expect_name();
        t->a.push_back(std::move(e));
        if (at_op("(")) {
          ++i_;
          arguments(*t);
        } else if (!done() && t_[i_].kind != Token::Kind::kOp &&
                   !(t_[i_].kind == Token::Kind::kName && keywords().count(t_[i_].text))) {
          t->a.push_back(primary());  // `x is divisibleby 3`
        }
        e = std::move(t);
      } else {
        return e;
      }
    }
  }

  static constexpr int kMaxDepth = 200;
  const std::vector<Token>& t_;
  std::size_t i_;
  int line_;
  int depth_ = 0, nots_ = 0, signs_ = 0, nodes_ = 0;
};

class Parser {
 public:
  explicit Parser(std::vector<Segment> segs) : segs_(std::move(segs)) {}

  std::unique_ptr<Node> run() {
    auto root = std::make_unique<Node>();
    std::string end;
    root->body = body({}, end);
    return root;
  }

 private:
  std::string keyword(const Segment& s) const {
    if (s.tokens.empty() || s.tokens[0].kind != Token::Kind::kName) fail(s.line, "empty tag");
    return s.tokens[0].text;
  }
  // Statements until one of `ends` (returned in `end`, its segment consumed).
  std::vector<std::unique_ptr<Node>> body(const std::set<std::string>& ends, std::string& end) {
    std::vector<std::unique_ptr<Node>> out;
    while (k_ < segs_.size()) {
      Segment& s = segs_[k_];
      if (s.kind == Segment::Kind::kComment) {
        ++k_;
        continue;
      }
      if (s.kind == Segment::Kind::kText) {
        ++k_;
        if (s.text.empty()) continue;
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::kText;
        n->text = std::move(s.text);
        out.push_back(std::move(n));
        continue;
      }
      if (s.kind == Segment::Kind::kOutput) {
        ++k_;
        ExprParser p(s.tokens, 0, s.line);
        auto n = std::make_unique<Node>();
        n->kind = Node::Kind::kOutput;
        n->line = s.line;
        n->expr = p.expression();
        p.expect_end();
        out.push_back(std::move(n));
        continue;
      }
      const std::string kw = keyword(s);
      if (ends.count(kw)) {
        end = kw;
        return out;
      }
      ++k_;
      out.push_back(statement(s, kw));
    }
    if (!ends.empty()) fail(segs_.empty() ? 1 : segs_.back().line, "missing end tag");
    return out;
  }
  std::unique_ptr<Node> statement(const Segment& s, const std::string& kw) {
    if (++depth_ > 200) fail(s.line, "blocks nested too deeply");
    struct Leave {
      int& d;
      ~Leave() { --d; }
    } leave{depth_};
    auto n = std::make_unique<Node>();
    n->line = s.line;
    ExprParser p(s.tokens, 1, s.line);
    std::string end;
    if (kw == "for") {
      n->kind = Node::Kind::kFor;
      n->targets.push_back(p.expect_name());
      while (p.at_op(",")) {
        p.expect_op(",");
        n->targets.push_back(p.expect_name());
      }
      if (!p.at_name("in")) fail(s.line, "expected 'in' in for");
      ExprParser q(s.tokens, p.pos() + 1, s.line);
      n->expr = q.or_expr();
      if (q.at_name("if")) {
        ExprParser f(s.tokens, q.pos() + 1, s.line);
        n->filter = f.expression();
        if (f.at_name("recursive")) fail(s.line, "recursive loops", true);
        f.expect_end();
      } else {
        if (q.at_name("recursive")) fail(s.line, "recursive loops", true);
        q.expect_end();
      }
      auto loop = std::make_unique<Node>();
      loop->body = body({"else", "endfor"}, end);
      n->body.push_back(std::move(loop));
      if (end == "else") {
        ++k_;
        auto other = std::make_unique<Node>();
        other->body = body({"endfor"}, end);
        n->body.push_back(std::move(other));
      }
      ++k_;  // endfor
      return n;
    }
    if (kw == "if") {
      n->kind = Node::Kind::kIf;
      n->conds.push_back(p.expression());
      p.expect_end();
      for (;;) {
        auto branch = std::make_unique<Node>();
        branch->body = body({"elif", "else", "endif"}, end);
        n->body.push_back(std::move(branch));
        const Segment& e = segs_[k_++];
        if (end == "endif") return n;
        if (end == "elif") {
          ExprParser c(e.tokens, 1, e.line);
          n->conds.push_back(c.expression());
          c.expect_end();
        } else {  // else: the last branch
          auto last = std::make_unique<Node>();
          last->body = body({"endif"}, end);
          n->body.push_back(std::move(last));
          ++k_;
          return n;
        }
      }
    }
    if (kw == "set") {
      n->kind = Node::Kind::kSet;
      n->targets.push_back(p.expect_name());
      if (p.at_op(".")) {
        p.expect_op(".");
        n->targets.push_back(p.expect_name());
      }
      if (!p.at_op("=")) fail(s.line, "block assignments ({% set x %}...{% endset %})", true);
      p.expect_op("=");
      n->expr = p.expression();
      p.expect_end();
      return n;
    }
    if (kw == "break" || kw == "continue") {
      n->kind = kw == "break" ? Node::Kind::kBreak : Node::Kind::kContinue;
      p.expect_end();
      return n;
    }
    if (kw == "generation") {  // transformers' assistant-mask marker: its body as it is
      n->kind = Node::Kind::kBody;
      n->body = body({"endgeneration"}, end);
      ++k_;
      return n;
    }
    if (kw.rfind("end", 0) == 0 || kw == "elif" || kw == "else") {
      fail(s.line, "'" + kw + "' without its opening tag");
    }
    fail(s.line, "the '" + kw + "' tag", true);
  }

  std::vector<Segment> segs_;
  std::size_t k_ = 0;
  int depth_ = 0;
};

}  // namespace

Result<std::unique_ptr<Node>> parse_template(std::string_view source) {
  // jinja2's keep_trailing_newline=False: one newline at the end of the source is dropped.
  if (source.ends_with("\r\n")) {
    source.remove_suffix(2);
  } else if (source.ends_with('\n')) {
    source.remove_suffix(1);
  }
  try {
    std::vector<Segment> segs = Lexer(source).run();
    apply_whitespace_control(segs);
    return Parser(std::move(segs)).run();
  } catch (const ParseError& e) {
    if (e.unsupported) return unimplemented("{} is not supported", e.message);
    return invalid_argument("{}", e.message);
  }
}

}  // namespace ferry::model::jinja
