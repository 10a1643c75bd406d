#include "loom/runtime/memory_plan.h"

#include <algorithm>

#include "loom/core/error.h"
#include "loom/ops/op.h"

namespace loom::runtime {

int64_t value_bytes(const ir::Value& v) {
  return numel(v.type.shape) * int64_t(dtype_size(v.type.dtype));
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

  for (int i = 0; i < nn; ++i) {
    const ir::Node& n = g.node(i);
    const ops::OpDef& def = ops::op_def(n.op);
    if (def.view) p.root[n.outputs[0]] = p.root[n.inputs[0]];
    for (auto [o, in] : def.inplace) {
      LOOM_CHECK(last_read[n.inputs[in]] == i)
          << "in-place op " << n.op << " overwrites %" << g.value(n.inputs[in]).name
          << " which is read later";
      p.root[n.outputs[o]] = p.root[n.inputs[in]];
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
  std::stable_sort(roots.begin(), roots.end(), [&](int a, int b) {
    return value_bytes(g.value(a)) > value_bytes(g.value(b));
  });

  struct Placed {
    int64_t off, end;
    int first, last;
  };
  std::vector<Placed> placed;
  std::vector<std::pair<int64_t, int64_t>> busy;
  for (int r : roots) {
    int64_t size = (value_bytes(g.value(r)) + 63) / 64 * 64;
    busy.clear();
    for (const Placed& q : placed)
      if (q.first <= p.last[r] && p.first[r] <= q.last) busy.push_back({q.off, q.end});
    std::sort(busy.begin(), busy.end());
    int64_t off = 0;
    for (auto [b, e] : busy) {
      if (off + size <= b) break;
      off = std::max(off, e);
    }
    placed.push_back({off, off + size, p.first[r], p.last[r]});
    p.offset[r] = off;
    p.arena_bytes = std::max(p.arena_bytes, off + size);
  }
  for (int v = 0; v < nv; ++v)
    if (g.value(p.root[v]).kind == ir::ValueKind::node) p.offset[v] = p.offset[p.root[v]];
  return p;
}

}  // namespace loom::runtime
