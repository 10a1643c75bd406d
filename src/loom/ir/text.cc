#include "loom/ir/text.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>

#include "loom/core/error.h"

namespace loom::ir {

namespace {

std::string format_double(double d) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";  // keep it a float on re-read
  return s;
}

std::string format_attr(const AttrValue& v) {
  if (auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if (auto* d = std::get_if<double>(&v)) return format_double(*d);
  if (auto* s = std::get_if<std::string>(&v)) return "\"" + *s + "\"";
  const auto& l = std::get<std::vector<int64_t>>(v);
  std::string r = "[";
  for (size_t i = 0; i < l.size(); ++i) r += (i ? ", " : "") + std::to_string(l[i]);
  return r + "]";
}

}  // namespace

std::string print(const Graph& g) { return print(g, nullptr); }

std::string print(const Graph& g, const std::function<std::string(int)>& annotate) {
  auto type = [&](const Value& v) { return type_str(v.type) + (annotate ? annotate(v.id) : ""); };
  std::string out = "graph " + g.name() + " {\n";
  for (const Value& v : g.values())
    if (v.kind != ValueKind::node)
      out += fmt::format("  {} %{} : {}\n", kind_name(v.kind), v.name, type(v));
  for (const Node& n : g.nodes()) {
    out += "  ";
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      const Value& v = g.value(n.outputs[i]);
      out += fmt::format("{}%{} : {}", i ? ", " : "", v.name, type(v));
    }
    out += fmt::format(" = {}(", n.op);
    for (size_t i = 0; i < n.inputs.size(); ++i)
      out += (i ? ", %" : "%") + g.value(n.inputs[i]).name;
    out += ")";
    if (!n.attrs.empty()) {
      out += " {";
      bool first = true;
      for (const auto& [k, v] : n.attrs) {
        out += (first ? "" : ", ") + k + " = " + format_attr(v);
        first = false;
      }
      out += "}";
    }
    out += "\n";
  }
  if (!g.outputs().empty()) {
    out += "  output";
    for (size_t i = 0; i < g.outputs().size(); ++i)
      out += (i ? ", %" : " %") + g.value(g.outputs()[i]).name;
    out += "\n";
  }
  return out + "}\n";
}

namespace {

bool is_name_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-';
}

class Parser {
 public:
  Parser(std::string_view text, const std::string& source) : s_(text), source_(source) {}

  Graph run() {
    expect_word("graph");
    Graph g(word());
    expect('{');
    bool in_nodes = false;
    while (true) {
      skip_ws();
      if (peek() == '}') {
        ++pos_;
        break;
      }
      if (peek() == '%') {
        in_nodes = true;
        parse_node(g);
        continue;
      }
      std::string w = word();
      if (w == "output") {
        do {
          g.add_output(value_ref(g));
        } while (accept(','));
      } else {
        ValueKind kind;
        if (w == "param")
          kind = ValueKind::param;
        else if (w == "state")
          kind = ValueKind::state;
        else if (w == "input")
          kind = ValueKind::input;
        else
          fail("expected param, state, input, output or a node, got '" + w + "'");
        if (in_nodes) fail("graph inputs must come before nodes");
        std::string name = value_name();
        expect(':');
        TensorType t = type();
        if (g.find(name) >= 0) fail("duplicate value %" + name);
        g.add_input(name, t, kind);
      }
    }
    skip_ws();
    if (pos_ != s_.size()) fail("trailing text after the graph");
    return g;
  }

 private:
  [[noreturn]] void fail(const std::string& msg) {
    int line = 1;
    for (size_t i = 0; i < pos_ && i < s_.size(); ++i) line += s_[i] == '\n';
    throw Error(fmt::format("{}:{}: IR parse error: {}", source_, line, msg));
  }
  void skip_ws() {
    while (pos_ < s_.size()) {
      if (std::isspace(static_cast<unsigned char>(s_[pos_])))
        ++pos_;
      else if (s_[pos_] == '#') {
        while (pos_ < s_.size() && s_[pos_] != '\n') ++pos_;
      } else
        break;
    }
  }
  char peek() {
    skip_ws();
    return pos_ < s_.size() ? s_[pos_] : '\0';
  }
  bool accept(char c) {
    if (peek() == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!accept(c)) fail(fmt::format("expected '{}'", c));
  }
  std::string word() {
    skip_ws();
    size_t b = pos_;
    while (pos_ < s_.size() && is_name_char(s_[pos_])) ++pos_;
    if (b == pos_) fail("expected a name");
    return std::string(s_.substr(b, pos_ - b));
  }
  void expect_word(const char* w) {
    if (word() != w) fail(fmt::format("expected '{}'", w));
  }
  std::string value_name() {
    expect('%');
    if (pos_ >= s_.size() || !is_name_char(s_[pos_])) fail("expected a value name after %");
    return word();
  }
  int value_ref(const Graph& g) {
    std::string n = value_name();
    int id = g.find(n);
    if (id < 0) fail("use of undefined value %" + n);
    return id;
  }
  int64_t integer() {
    skip_ws();
    int64_t v = 0;
    auto r = std::from_chars(s_.data() + pos_, s_.data() + s_.size(), v);
    if (r.ec != std::errc()) fail("expected an integer");
    pos_ = r.ptr - s_.data();
    return v;
  }
  TensorType type() {
    TensorType t;
    std::string d = word();
    if (!parse_dtype(d, &t.dtype)) fail("unknown dtype '" + d + "'");
    expect('[');
    if (!accept(']')) {
      do {
        int64_t v = integer();
        if (v < 0) fail("negative dim");
        t.shape.push_back(v);
      } while (accept(','));
      expect(']');
    }
    return t;
  }
  AttrValue attr_value() {
    char c = peek();
    if (c == '"') {
      ++pos_;
      size_t b = pos_;
      while (pos_ < s_.size() && s_[pos_] != '"' && s_[pos_] != '\n') ++pos_;
      if (pos_ >= s_.size() || s_[pos_] != '"') fail("unterminated string");
      std::string r(s_.substr(b, pos_ - b));
      ++pos_;
      return r;
    }
    if (c == '[') {
      ++pos_;
      std::vector<int64_t> l;
      if (!accept(']')) {
        do l.push_back(integer());
        while (accept(','));
        expect(']');
      }
      return l;
    }
    size_t b = pos_;
    while (pos_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[pos_])) ||
                                s_[pos_] == '.' || s_[pos_] == '-' || s_[pos_] == '+'))
      ++pos_;
    std::string tok(s_.substr(b, pos_ - b));
    if (tok.empty()) fail("expected an attribute value");
    if (tok.find_first_of(".eEn") != std::string::npos) {
      double d = 0;
      auto r = std::from_chars(tok.data(), tok.data() + tok.size(), d);
      if (r.ec != std::errc() || r.ptr != tok.data() + tok.size()) fail("bad float '" + tok + "'");
      return d;
    }
    int64_t v = 0;
    auto r = std::from_chars(tok.data(), tok.data() + tok.size(), v);
    if (r.ec != std::errc() || r.ptr != tok.data() + tok.size()) fail("bad integer '" + tok + "'");
    return v;
  }
  void parse_node(Graph& g) {
    std::vector<std::string> names;
    std::vector<TensorType> types;
    do {
      names.push_back(value_name());
      expect(':');
      types.push_back(type());
    } while (accept(','));
    expect('=');
    const std::string op_word = word();
    Op op{};
    try {
      op = parse_op(op_word);
    } catch (const Error& e) {
      fail(e.what());
    }
    expect('(');
    std::vector<int> inputs;
    if (!accept(')')) {
      do inputs.push_back(value_ref(g));
      while (accept(','));
      expect(')');
    }
    Attrs attrs;
    if (accept('{')) {
      if (!accept('}')) {
        do {
          std::string k = word();
          expect('=');
          if (attrs.count(k)) fail("duplicate attribute " + k);
          attrs[k] = attr_value();
        } while (accept(','));
        expect('}');
      }
    }
    for (const auto& n : names)
      if (g.find(n) >= 0) fail("duplicate value %" + n);
    g.add_node(op, std::move(inputs), std::move(attrs), types, names);
  }

  std::string_view s_;
  std::string source_;
  size_t pos_ = 0;
};

}  // namespace

Graph parse(std::string_view text, const std::string& source) { return Parser(text, source).run(); }

}  // namespace loom::ir
