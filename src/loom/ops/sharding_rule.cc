// The einsum-like rule spec (sharding_rule.h) and the all-fixed fallback.
#include "loom/ops/sharding_rule.h"

#include <cctype>
#include <map>

#include "loom/core/error.h"
#include "loom/ops/op.h"

namespace loom::ops {

FactorKind FactorRule::kind(int f, int result) const {
  if (fixed[size_t(f)]) return FactorKind::fixed;
  for (const auto& dim : results[size_t(result)])
    for (int x : dim)
      if (x == f) return FactorKind::pass;
  return FactorKind::reduce;
}

namespace {

// One tensor's spec: items are a letter, '*', or a parenthesised group of letters.
struct Item {
  std::string letters;  // empty for '*'
  bool star = false;
};

std::vector<std::vector<Item>> parse_side(std::string_view s, std::string_view spec) {
  std::vector<std::vector<Item>> tensors(1);
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c == ',') {
      tensors.emplace_back();
    } else if (c == '*') {
      tensors.back().push_back({"", true});
    } else if (c == '(') {
      size_t j = s.find(')', i);
      LOOM_CHECK(j != std::string_view::npos) << "sharding rule '" << spec << "': unclosed (";
      tensors.back().push_back({std::string(s.substr(i + 1, j - i - 1)), false});
      i = j;
    } else {
      LOOM_CHECK(std::isalpha(static_cast<unsigned char>(c))) << "sharding rule '" << spec << "'";
      tensors.back().push_back({std::string(1, c), false});
    }
  }
  if (s.empty()) tensors.clear();
  return tensors;
}

}  // namespace

FactorRule einsum_rule(std::string_view spec, const std::vector<ir::TensorType>& in,
                       const std::vector<ir::TensorType>& out, std::vector<int> linear) {
  size_t arrow = spec.find("->");
  LOOM_CHECK(arrow != std::string_view::npos) << "sharding rule '" << spec << "' lacks ->";
  auto lhs = parse_side(spec.substr(0, arrow), spec);
  auto rhs = parse_side(spec.substr(arrow + 2), spec);
  // an empty side is no tensor, or one scalar ("x,->x" spells a scalar among others)
  if (lhs.empty() && in.size() == 1 && in[0].shape.empty()) lhs.emplace_back();
  if (rhs.empty() && out.size() == 1 && out[0].shape.empty()) rhs.emplace_back();
  LOOM_CHECK(lhs.size() == in.size() && rhs.size() == out.size())
      << "sharding rule '" << spec << "' names " << lhs.size() << "->" << rhs.size()
      << " tensors for an op with " << in.size() << "->" << out.size();
  FactorRule r;
  r.linear = std::move(linear);
  std::map<char, int> id;
  std::vector<int> star;
  auto factor = [&](char c) {
    auto [it, fresh] = id.try_emplace(c, r.num_factors());
    if (fresh) r.add_factor(-1, std::isupper(static_cast<unsigned char>(c)) != 0);
    return it->second;
  };
  auto build = [&](const std::vector<Item>& items, const ir::TensorType& t) {
    std::vector<std::vector<int>> dims;
    int explicit_dims = 0;
    for (const Item& it : items) explicit_dims += it.star ? 0 : 1;
    const int rank = int(t.shape.size());
    for (const Item& it : items) {
      if (it.star) {
        int k = rank - explicit_dims;
        LOOM_CHECK(k >= 0) << "sharding rule '" << spec << "' does not fit " << type_str(t);
        for (int i = 0; i < k; ++i) {
          if (i == int(star.size())) star.push_back(r.add_factor(-1, false));
          dims.push_back({star[size_t(i)]});
        }
      } else {
        std::vector<int> d;
        for (char c : it.letters) d.push_back(factor(c));
        dims.push_back(d);
      }
    }
    LOOM_CHECK(int(dims.size()) == rank)
        << "sharding rule '" << spec << "' has " << dims.size() << " dims for " << type_str(t);
    return dims;
  };
  for (size_t i = 0; i < in.size(); ++i) r.operands.push_back(build(lhs[i], in[i]));
  for (size_t i = 0; i < out.size(); ++i) r.results.push_back(build(rhs[i], out[i]));
  // sizes: single-factor dims first, then composite dims with one unknown factor
  auto each_dim = [&](auto&& fn) {
    for (size_t i = 0; i < in.size(); ++i)
      for (size_t d = 0; d < r.operands[i].size(); ++d) fn(r.operands[i][d], in[i].shape[d]);
    for (size_t i = 0; i < out.size(); ++i)
      for (size_t d = 0; d < r.results[i].size(); ++d) fn(r.results[i][d], out[i].shape[d]);
  };
  for (int pass = 0; pass < 3; ++pass)
    each_dim([&](const std::vector<int>& fs, int64_t n) {
      int64_t known = 1;
      int unknown = -1, count = 0;
      for (int f : fs) {
        if (r.size[size_t(f)] < 0)
          unknown = f, ++count;
        else
          known *= r.size[size_t(f)];
      }
      if (count == 1 && known > 0) r.size[size_t(unknown)] = n / known;
    });
  each_dim([&](const std::vector<int>& fs, int64_t n) {
    int64_t p = 1;
    for (int f : fs) p *= r.size[size_t(f)];
    LOOM_CHECK(p == n) << "sharding rule '" << spec << "': factor sizes give " << p
                       << " for a dim of " << n;
  });
  return r;
}

ShardingRule einsum(std::string spec, std::vector<int> linear) {
  return {.rule = [spec = std::move(spec), linear = std::move(linear)](
                      const std::vector<ir::TensorType>& in, const std::vector<ir::TensorType>& out,
                      const ir::Attrs&) { return einsum_rule(spec, in, out, linear); }};
}

int index_into_block(LowerContext& c, int ids, const std::vector<std::string>& axes,
                     int64_t block) {
  int64_t size = block;
  for (const std::string& a : axes) size *= c.axis_size(a);
  for (const std::string& a : axes) {
    const int64_t n = c.axis_size(a);
    ids = c.emit(ir::Op::shard_index, {ids}, {{"axis", a}, {"n", n}, {"size", size}});
    size /= n;
  }
  return ids;
}

FactorRule factor_rule(const ir::Graph& g, const ir::Node& n) {
  std::vector<ir::TensorType> in, out;
  for (int v : n.inputs) in.push_back(g.value(v).type);
  for (int v : n.outputs) out.push_back(g.value(v).type);
  const OpDef& def = op_def(n.op);
  if (def.sharding.rule) return def.sharding.rule(in, out, n.attrs);
  return fixed_rule(in, out);
}

FactorRule fixed_rule(const std::vector<ir::TensorType>& in,
                      const std::vector<ir::TensorType>& out) {
  FactorRule r;
  auto fixed = [&](const std::vector<ir::TensorType>& ts, auto& side) {
    for (const auto& t : ts) {
      std::vector<std::vector<int>> dims;
      for (int64_t s : t.shape) dims.push_back({r.add_factor(s, true)});
      side.push_back(dims);
    }
  };
  fixed(in, r.operands);
  fixed(out, r.results);
  return r;
}

}  // namespace loom::ops
