#include "loom/ops/verify.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <mutex>
#include <string_view>
#include <unordered_set>

#include "loom/core/error.h"
#include "loom/ops/op.h"

namespace loom::ops {

namespace {

// The versions (ir::Graph::version) of the last graphs found valid: a graph of one of them is
// valid without a second look.
class Verified {
 public:
  bool has(uint64_t v) {
    std::lock_guard<std::mutex> lock(mu_);
    return std::find(seen_.begin(), seen_.end(), v) != seen_.end();
  }
  void add(uint64_t v) {
    std::lock_guard<std::mutex> lock(mu_);
    seen_[next_++ % seen_.size()] = v;
  }

 private:
  std::mutex mu_;
  std::array<uint64_t, 16> seen_{};  // 0: the empty graph's version, which is valid
  size_t next_ = 0;
};
Verified verified;

std::vector<std::string> check(const ir::Graph& g) {
  std::vector<std::string> d;
  std::vector<int> defined_at(g.values().size(), -2);  // -1: graph input; >= 0: producing node
  std::unordered_set<std::string_view> names;
  names.reserve(g.values().size());
  for (const ir::Value& v : g.values()) {
    if (!names.insert(v.name).second) d.push_back(fmt::format("duplicate value name %{}", v.name));
    if (v.kind != ir::ValueKind::node) defined_at[v.id] = -1;
  }
  std::vector<int> last_read(g.values().size(), -1);
  for (const ir::Node& n : g.nodes())
    for (int in : n.inputs) last_read[in] = n.id;
  for (int o : g.outputs()) last_read[o] = int(g.nodes().size());

  for (const ir::Node& n : g.nodes()) {
    // named only where a problem is found (formatting it for every node was most of the check)
    auto where = [&] {
      std::string w = fmt::format("node #{} {}", n.id, n.op);
      if (!n.outputs.empty()) w += fmt::format(" (%{})", g.value(n.outputs[0]).name);
      return w;
    };
    bool inputs_ok = true;
    std::vector<ir::TensorType> in;
    for (int v : n.inputs) {
      if (v < 0 || v >= int(g.values().size())) {
        d.push_back(fmt::format("{}: input id {} does not exist", where(), v));
        inputs_ok = false;
        continue;
      }
      if (defined_at[v] == -2 || defined_at[v] >= n.id) {
        d.push_back(
            fmt::format("{}: input %{} is used before it is defined", where(), g.value(v).name));
        inputs_ok = false;
      }
      in.push_back(g.value(v).type);
    }
    for (int o : n.outputs) defined_at[o] = n.id;
    if (!inputs_ok) continue;
    const OpDef& def = op_def(n.op);
    std::vector<ir::TensorType> expect;
    try {
      expect = def.infer(in, n.attrs);
    } catch (const Error& e) {
      d.push_back(fmt::format("{}: {}", where(), e.what()));
      continue;
    }
    if (expect.size() != n.outputs.size()) {
      d.push_back(fmt::format("{}: has {} outputs, the op produces {}", where(), n.outputs.size(),
                              expect.size()));
      continue;
    }
    for (size_t i = 0; i < expect.size(); ++i)
      if (g.value(n.outputs[i]).type != expect[i])
        d.push_back(fmt::format("{}: output %{} is {}, the op infers {}", where(),
                                g.value(n.outputs[i]).name,
                                ir::type_str(g.value(n.outputs[i]).type), ir::type_str(expect[i])));
    // an asynchronous collective's output is in flight until its wait: only the wait reads it,
    // and the wait names the collective's input too (so nothing overwrites it before)
    if (def.traits.has(Trait::completion)) {
      const ir::Value& h = g.value(n.inputs[0]);
      const bool from_async = h.kind == ir::ValueKind::node &&
                              g.node(h.producer).attr_int("async", 0) == 1 &&
                              g.node(h.producer).inputs[0] == n.inputs[1];
      if (!from_async)
        d.push_back(fmt::format("{}: %{} is not the output of an asynchronous collective of %{}",
                                where(), h.name, g.value(n.inputs[1]).name));
    }
    if (!def.traits.has(Trait::completion))
      for (int v : n.inputs) {
        const ir::Value& iv = g.value(v);
        if (iv.kind == ir::ValueKind::node && g.node(iv.producer).attr_int("async", 0) == 1)
          d.push_back(
              fmt::format("{}: reads %{} while its collective is in flight (before its wait)",
                          where(), iv.name));
      }
    for (auto [o, i] : def.inplace)
      if (last_read[n.inputs[i]] != n.id)
        d.push_back(fmt::format("{}: overwrites %{} in place, but node #{} reads it later", where(),
                                g.value(n.inputs[i]).name, last_read[n.inputs[i]]));
  }
  for (int o : g.outputs())
    if (o < 0 || o >= int(g.values().size()))
      d.push_back(fmt::format("graph output id {} is invalid", o));
  return d;
}

}  // namespace

std::vector<std::string> verify(const ir::Graph& g) {
  if (verified.has(g.version())) return {};
  std::vector<std::string> d = check(g);
  if (d.empty()) verified.add(g.version());
  return d;
}

void verify_or_throw(const ir::Graph& g, const std::string& source) {
  auto d = verify(g);
  if (d.empty()) return;
  std::string msg =
      fmt::format("{}: invalid graph ({} problem{}):", source, d.size(), d.size() == 1 ? "" : "s");
  for (size_t i = 0; i < d.size() && i < 20; ++i) msg += "\n  " + d[i];
  throw Error(msg);
}

}  // namespace loom::ops
