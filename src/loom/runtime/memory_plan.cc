#include "loom/runtime/memory_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "loom/core/error.h"
#include "loom/ops/op.h"

namespace loom::runtime {

int64_t value_bytes(const ir::Value& v) {
  return numel(v.type.shape) * int64_t(dtype_size(v.type.dtype));
}

int64_t saved_activation_bytes(const ir::Graph& g, const MemoryPlan& p, int loss,
                               const std::vector<int>& batch) {
  const ir::Value& local = g.value(ops::before_collectives(g, loss));
  if (local.kind != ir::ValueKind::node) return 0;
  const int at = local.producer;
  std::vector<bool> derived(g.values().size(), false);
  for (int b : batch) derived[size_t(b)] = true;
  for (const ir::Node& n : g.nodes()) {
    bool d = false;
    for (int v : n.inputs) d = d || derived[size_t(v)];
    for (int v : n.outputs) derived[size_t(v)] = d;
  }
  int64_t bytes = 0;
  for (const ir::Value& v : g.values())
    if (v.kind == ir::ValueKind::node && p.root[size_t(v.id)] == v.id && derived[size_t(v.id)] &&
        p.first[size_t(v.id)] >= 0 && p.first[size_t(v.id)] <= at && p.last[size_t(v.id)] > at)
      bytes += value_bytes(v);
  return bytes;
}

MemoryPlan plan_memory(const ir::Graph& g) {
  const int nv = int(g.values().size()), nn = int(g.nodes().size());
  MemoryPlan p;
  p.root.resize(nv);
  p.offset.assign(nv, -1);
  p.first.assign(nv, -1);
  p.last.assign(nv, -1);
  for (int v = 0; v < nv; ++v) p.root[v] = v;

  std::vector<int> last_read(nv, -1);
  for (int i = 0; i < nn; ++i)
    for (int in : g.node(i).inputs) last_read[in] = i;
  for (int v : g.outputs()) last_read[v] = nn;

  // root_last[r]: the last node reading any value that shares root r's buffer (so far).
  std::vector<int> root_last = last_read;
  auto is_node = [&](int v) { return g.value(v).kind == ir::ValueKind::node; };
  for (int i = 0; i < nn; ++i) {
    const ir::Node& n = g.node(i);
    const ops::OpDef& def = ops::op_def(n.op);
    auto alias = [&](int out, int in) {
      int r = p.root[in];
      p.root[out] = r;
      root_last[r] = std::max(root_last[r], last_read[out]);
    };
    if (def.traits.has(ops::Trait::view)) alias(n.outputs[0], n.inputs[0]);
    for (auto [o, in] : def.inplace) {
      LOOM_CHECK(root_last[p.root[n.inputs[in]]] == i)
          << "in-place op " << n.op << " overwrites %" << g.value(n.inputs[in]).name
          << " which is read later";
      alias(n.outputs[o], n.inputs[in]);
    }
    // Optional in-place: an output takes over a dying input's buffer of the same size.
    std::vector<bool> taken(n.inputs.size(), false);
    for (auto [o, in] : def.reuse) {
      int out = n.outputs[o], src = n.inputs[in];
      if (p.root[out] != out || taken[in]) continue;
      int r = p.root[src];
      if (!is_node(r) || root_last[r] != i || value_bytes(g.value(r)) != value_bytes(g.value(out)))
        continue;
      bool used_twice = false;  // the same buffer fed to two inputs (add(x, x)) must not be reused
      for (size_t k = 0; k < n.inputs.size(); ++k)
        if (int(k) != in && p.root[n.inputs[k]] == r) used_twice = true;
      if (used_twice) continue;
      taken[in] = true;
      alias(out, src);
    }
  }

  for (int v = 0; v < nv; ++v) {
    const ir::Value& val = g.value(v);
    if (val.kind != ir::ValueKind::node) {
      p.external_bytes += value_bytes(val);
      continue;
    }
    int r = p.root[v];
    if (g.value(r).kind != ir::ValueKind::node) continue;  // aliases an external buffer
    int def_at = g.value(v).producer;
    if (p.first[r] < 0 || def_at < p.first[r]) p.first[r] = def_at;
    p.last[r] = std::max({p.last[r], def_at, last_read[v]});
  }

  std::vector<int> roots;
  for (int v = 0; v < nv; ++v)
    if (p.root[v] == v && g.value(v).kind == ir::ValueKind::node) roots.push_back(v);
  std::stable_sort(roots.begin(), roots.end(),
                   [&](int a, int b) { return value_bytes(g.value(a)) > value_bytes(g.value(b)); });

  struct Placed {
    int64_t off, end;
    int first, last;
  };
  // kept in (off, end) order, so the blocks live at the same time as r are met lowest first
  std::vector<Placed> placed;
  for (int r : roots) {
    int64_t size = (value_bytes(g.value(r)) + 63) / 64 * 64;
    int64_t off = 0;
    for (const Placed& q : placed) {
      if (q.first > p.last[r] || p.first[r] > q.last) continue;
      if (off + size <= q.off) break;
      off = std::max(off, q.end);
    }
    const Placed np{off, off + size, p.first[r], p.last[r]};
    placed.insert(std::upper_bound(placed.begin(), placed.end(), np,
                                   [](const Placed& x, const Placed& y) {
                                     return std::pair(x.off, x.end) < std::pair(y.off, y.end);
                                   }),
                  np);
    p.offset[r] = off;
    p.arena_bytes = std::max(p.arena_bytes, off + size);
  }
  for (int v = 0; v < nv; ++v)
    if (g.value(p.root[v]).kind == ir::ValueKind::node) p.offset[v] = p.offset[p.root[v]];
  return p;
}

std::string memory_report(const ir::Graph& g, const MemoryPlan& p, int top) {
  const int nn = int(g.nodes().size());
  std::vector<int64_t> live(size_t(nn) + 1, 0);
  for (const ir::Value& v : g.values())
    if (p.root[v.id] == v.id && v.kind == ir::ValueKind::node && p.first[v.id] >= 0)
      for (int i = p.first[v.id]; i <= std::min(p.last[v.id], nn); ++i) live[i] += value_bytes(v);
  int peak = int(std::max_element(live.begin(), live.end()) - live.begin());
  std::map<std::string, std::pair<int64_t, int>> groups;
  for (const ir::Value& v : g.values())
    if (p.root[v.id] == v.id && v.kind == ir::ValueKind::node && p.first[v.id] <= peak &&
        peak <= p.last[v.id]) {
      std::string key;
      for (char c : v.name) {
        if (std::isdigit(static_cast<unsigned char>(c))) {
          if (key.empty() || key.back() != 'N') key += 'N';
        } else
          key += c;
      }
      groups[key].first += value_bytes(v);
      groups[key].second++;
    }
  std::vector<std::pair<int64_t, std::string>> sorted;
  for (auto& [k, b] : groups) sorted.push_back({b.first, fmt::format("{} x{}", k, b.second)});
  std::sort(sorted.rbegin(), sorted.rend());
  std::string r = fmt::format("arena {:.1f} MiB; peak of live values {:.1f} MiB at node {} ({})\n",
                              p.arena_bytes / 1048576.0, live[peak] / 1048576.0, peak,
                              peak < nn ? ir::op_name(g.node(peak).op) : std::string_view("end"));
  for (int i = 0; i < top && i < int(sorted.size()); ++i)
    r += fmt::format("  {:8.1f} MiB  {}\n", sorted[i].first / 1048576.0, sorted[i].second);
  return r;
}

}  // namespace loom::runtime
