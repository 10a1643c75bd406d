#include "loom/search/space.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>

#include "loom/core/error.h"
#include "loom/ops/op.h"
#include "loom/shard/plan.h"

namespace loom::search {

namespace {

using Recompute = passes::ScheduleOptions::Recompute;
using Bucket = passes::ScheduleOptions::Bucket;

// Every ordered factorization of n into at most `max_axes` factors of at least 2 (n = 1: the one
// empty mesh).
void factorizations(int64_t n, int max_axes, std::vector<int64_t>& cur,
                    std::vector<std::vector<int64_t>>& out) {
  if (n == 1) {
    out.push_back(cur);
    return;
  }
  if (int(cur.size()) == max_axes) return;
  for (int64_t f = 2; f <= n; ++f)
    if (n % f == 0) {
      cur.push_back(f);
      factorizations(n / f, max_axes, cur, out);
      cur.pop_back();
    }
}

bool is_tensor_parallel(const Role& r) { return r.order == 0; }
bool is_pipeline(const Role& r) { return r.order == -1; }

// Whether a parameter is both an embedding's table and a matmul's weight (through casts): a tied
// embedding and head (GPT-2, tie_embeddings), which the first and last stages would both read.
bool tied_embedding(const ir::Graph& g) {
  const std::vector<int> root = ops::param_roots(g);
  std::vector<int> use(g.values().size(), 0);  // per parameter: 1 embedding, 2 matmul
  for (const ir::Node& n : g.nodes()) {
    const int bit = n.op == ir::Op::embedding ? 1 : n.op == ir::Op::matmul ? 2 : 0;
    for (int in : n.inputs)
      if (bit && root[size_t(in)] >= 0) use[size_t(root[size_t(in)])] |= bit;
  }
  return std::find(use.begin(), use.end(), 3) != use.end();
}

// The pipeline decision's options: (schedule, micro-batches as a multiple of the stages).
struct PipeOption {
  std::string_view schedule;
  int64_t times;
};
const std::vector<PipeOption>& pipe_options() {
  static const std::vector<PipeOption> o{{"1f1b", 1},        {"1f1b", 2},
                                         {"1f1b", 4},        {"interleaved", 1},
                                         {"interleaved", 2}, {"interleaved", 4}};
  return o;
}

}  // namespace

const std::vector<Role>& roles() {
  static const std::vector<Role> r{
      {"data", "data", {"data"}, 2, true},
      {"zero1", "zero1", {"zero1", "data"}, 2, true},
      {"zero2", "zero2", {"zero2", "data"}, 2, true},
      {"fsdp", "fsdp", {"fsdp", "data"}, 2, true},
      {"megatron", "model", {"megatron"}, 0, false},
      {"megatron+sequence", "model", {"megatron", "sequence"}, 0, false},
      {"expert", "expert", {"expert"}, 1, true},
      {"pipeline", "pipe", {"pipeline"}, -1, true},
  };
  return r;
}

shard::Plan Candidate::plan() const {
  shard::Plan p;
  p.where = "[plan] (search)";
  if (mesh.empty()) return p;
  p.mesh = shard::Mesh(mesh, "[plan] mesh");
  for (int order = -1; order <= 2; ++order)
    for (size_t a = 0; a < mesh.size(); ++a) {
      const Role& r = search::roles()[size_t(roles[a])];
      if (r.order != order) continue;
      for (std::string_view t : r.tactics) {
        shard::Tactic tac{std::string(t), mesh[a].first};
        if (is_pipeline(r) && microbatches > 0)
          tac.schedule = schedule, tac.microbatches = microbatches;
        p.tactics.push_back(tac);
      }
    }
  return p;
}

void Candidate::apply(train::Config& cfg) const {
  cfg.plan.plan = plan();
  cfg.passes.recompute = recompute;
  cfg.passes.bucket = bucket;
  cfg.passes.reshard_after_forward = reshard_after_forward;
  cfg.passes.synthesize = synthesize;
}

std::string Candidate::key() const {
  std::string k = "{";
  for (size_t a = 0; a < mesh.size(); ++a)
    k += fmt::format("{}{}={}:{}", a ? "," : "", mesh[a].first, mesh[a].second,
                     search::roles()[size_t(roles[a])].name);
  return k + fmt::format(
                 "}} recompute={} bucket={} reshard_after_forward={}{}{}",
                 passes::recompute_name(recompute), passes::bucket_name(bucket),
                 reshard_after_forward, synthesize ? " synthesize" : "",
                 microbatches > 0 ? fmt::format(" pipeline={}x{}", schedule, microbatches) : "");
}

std::string Candidate::toml(const std::string& cluster) const {
  std::string t;
  const shard::Plan p = plan();
  if (!p.empty()) {
    t += "[plan]\nmesh = { ";
    for (size_t a = 0; a < mesh.size(); ++a)
      t += fmt::format("{}{} = {}", a ? ", " : "", mesh[a].first, mesh[a].second);
    t += " }\ntactics = [";
    for (size_t i = 0; i < p.tactics.size(); ++i) {
      const shard::Tactic& tac = p.tactics[i];
      t += fmt::format("{}\n  {{ kind = \"{}\", axis = \"{}\"", i ? "," : "", tac.kind, tac.axis);
      if (tac.kind == "pipeline")
        t += fmt::format(", schedule = \"{}\", microbatches = {}", tac.schedule, tac.microbatches);
      t += " }";
    }
    t += "\n]\n\n";
  }
  t += fmt::format("[passes]\nrecompute = \"{}\"\n", passes::recompute_name(recompute));
  if (!p.empty()) {
    t += fmt::format("bucket = \"{}\"\n", passes::bucket_name(bucket));
    if (synthesize) t += "synthesize = true\n";
    if (bucket == passes::ScheduleOptions::Bucket::automatic || synthesize)
      t += fmt::format("cluster = \"{}\"\n", cluster);
    t += fmt::format("reshard_after_forward = {}\n", reshard_after_forward);
  }
  return t;
}

Space::Space(const train::Config& cfg, const ir::Graph& graph, const ir::Roles& roles,
             SpaceOptions o)
    : cfg_(cfg), graph_(graph), roles_(roles), o_(std::move(o)) {
  if (o_.devices < 1)
    throw Error(fmt::format("plan search: {} devices", o_.devices), "give --devices N, N >= 1");
  if (o_.max_axes < 1) throw Error("plan search: max_axes must be at least 1");
  if (o_.recompute.empty() || o_.bucket.empty())
    throw Error("plan search: no recompute or bucket setting to choose from");
  std::vector<int64_t> cur;
  factorizations(o_.devices, o_.max_axes, cur, meshes_);
  tied_ = tied_embedding(graph_);
}

bool Space::role_ok(const std::vector<int>& prefix, int axis, int role) const {
  const std::vector<int64_t>& sizes = meshes_[size_t(prefix[0])];
  const Role& r = roles()[size_t(role)];
  int64_t batch_ways = r.splits_batch ? sizes[size_t(axis)] : 1;
  for (int a = 0; a < axis; ++a) {
    const Role& e = roles()[size_t(prefix[size_t(1 + a)])];
    if (prefix[size_t(1 + a)] == role) return false;                   // a role at most once
    if (is_tensor_parallel(e) && is_tensor_parallel(r)) return false;  // one TP axis
    if (e.splits_batch) batch_ways *= sizes[size_t(a)];
  }
  if (is_tensor_parallel(r) && roles_.column_parallel.empty() && roles_.row_parallel.empty())
    return false;
  // a pipeline: at least a parameter group a stage, no weight two stages read, and its
  // micro-batches are the step's accumulation (passes/pipeline_micro_batches.cc)
  if (is_pipeline(r) &&
      (int64_t(roles_.blocks.size()) < sizes[size_t(axis)] || tied_ || cfg_.train.grad_accum > 1))
    return false;
  if (r.name == "expert" && roles_.experts.empty()) return false;
  if (cfg_.train.batch_size % batch_ways) return false;
  // the compiler's check: the tactics so far, this axis's included, apply to the training graph
  Candidate c;
  for (int a = 0; a <= axis; ++a) {
    const int ra = a == axis ? role : prefix[size_t(1 + a)];
    c.mesh.push_back({std::string(roles()[size_t(ra)].axis), sizes[size_t(a)]});
    c.roles.push_back(ra);
  }
  const std::string key = c.key();
  auto it = accepted_.find(key);
  if (it != accepted_.end()) return it->second;
  bool ok = true;
  try {
    shard::apply_tactics(graph_, c.plan(), roles_);
  } catch (const Error&) {
    ok = false;
  }
  accepted_[key] = ok;
  return ok;
}

bool Space::complete(const std::vector<int>& prefix) const {
  if (prefix.empty()) return false;
  return prefix.size() == meshes_[size_t(prefix[0])].size() + 6;
}

std::vector<int> Space::options(const std::vector<int>& prefix) const {
  std::vector<int> out;
  if (prefix.empty()) {
    for (size_t m = 0; m < meshes_.size(); ++m) out.push_back(int(m));
    return out;
  }
  const size_t axes = meshes_[size_t(prefix[0])].size();
  const size_t level = prefix.size();
  if (level <= axes) {  // the role of axis level - 1
    for (size_t r = 0; r < roles().size(); ++r)
      if (role_ok(prefix, int(level - 1), int(r))) out.push_back(int(r));
  } else if (level == axes + 1) {
    for (size_t i = 0; i < o_.recompute.size(); ++i) out.push_back(int(i));
  } else if (level == axes + 2) {
    out.push_back(0);  // bucketing matters only where ranks communicate
    for (size_t i = 1; i < o_.bucket.size() && axes > 0; ++i) out.push_back(int(i));
  } else if (level == axes + 3) {
    out.push_back(0);  // reshard after forward: only under fsdp
    for (size_t a = 0; a < axes; ++a)
      if (roles()[size_t(prefix[1 + a])].name == "fsdp") out.push_back(1);
  } else if (level == axes + 4) {
    out.push_back(0);  // synthesized reductions: only where ranks communicate over levels
    if (o_.synthesize && axes > 0) out.push_back(1);
  } else if (level == axes + 5) {  // a pipeline's schedule and micro-batches
    const std::vector<int64_t>& sizes = meshes_[size_t(prefix[0])];
    int64_t stages = 0, batch_ways = 1;
    for (size_t a = 0; a < axes; ++a) {
      const Role& r = roles()[size_t(prefix[1 + a])];
      if (is_pipeline(r))
        stages = sizes[a];
      else if (r.splits_batch)
        batch_ways *= sizes[a];
    }
    if (stages == 0) {
      out.push_back(0);
      return out;
    }
    for (size_t i = 0; i < pipe_options().size(); ++i) {
      const PipeOption& po = pipe_options()[i];
      const int64_t m = stages * po.times;
      if (cfg_.train.batch_size % (m * batch_ways)) continue;
      if (po.schedule == "interleaved" && int64_t(roles_.blocks.size()) < 2 * stages) continue;
      out.push_back(int(i));
    }
  }
  return out;
}

Candidate Space::candidate(const std::vector<int>& d) const {
  LOOM_CHECK(complete(d)) << "plan search: an incomplete decision sequence";
  Candidate c;
  const std::vector<int64_t>& sizes = meshes_[size_t(d[0])];
  for (size_t a = 0; a < sizes.size(); ++a) {
    c.roles.push_back(d[1 + a]);
    c.mesh.push_back({std::string(roles()[size_t(d[1 + a])].axis), sizes[a]});
  }
  c.recompute = o_.recompute[size_t(d[sizes.size() + 1])];
  c.bucket = o_.bucket[size_t(d[sizes.size() + 2])];
  c.reshard_after_forward = d[sizes.size() + 3] == 0;
  c.synthesize = d[sizes.size() + 4] == 1;
  for (size_t a = 0; a < sizes.size(); ++a)
    if (is_pipeline(roles()[size_t(c.roles[a])])) {
      const PipeOption& po = pipe_options()[size_t(d[sizes.size() + 5])];
      c.schedule = std::string(po.schedule);
      c.microbatches = sizes[a] * po.times;
    }
  return c;
}

std::vector<std::vector<int>> Space::enumerate() const {
  std::vector<std::vector<int>> out;
  std::vector<int> cur;
  std::function<void()> walk = [&] {
    if (complete(cur)) {
      out.push_back(cur);
      return;
    }
    for (int o : options(cur)) {
      cur.push_back(o);
      walk();
      cur.pop_back();
    }
  };
  walk();
  return out;
}

// Completes `d` from its length on, each decision the one `keep` gives where it is open, else the
// first open option; false at a dead end.
namespace {
template <class Keep>
bool complete_with(const Space& s, std::vector<int>& d, Keep keep) {
  while (!s.complete(d)) {
    const std::vector<int> opts = s.options(d);
    if (opts.empty()) return false;
    const int k = keep(d.size());
    d.push_back(std::find(opts.begin(), opts.end(), k) != opts.end() ? k : opts[0]);
  }
  return true;
}
}  // namespace

std::vector<int> Space::with_axes(const std::vector<int64_t>& sizes, const std::vector<int>& roles,
                                  const std::vector<int>& tail) const {
  const auto m = std::find(meshes_.begin(), meshes_.end(), sizes);
  if (m == meshes_.end()) return {};
  std::vector<int> d{int(m - meshes_.begin())};
  for (int r : roles) {
    const std::vector<int> opts = options(d);
    if (std::find(opts.begin(), opts.end(), r) == opts.end()) return {};
    d.push_back(r);
  }
  const size_t at = d.size();
  if (!complete_with(*this, d, [&](size_t i) { return i - at < tail.size() ? tail[i - at] : -1; }))
    return {};
  return d;
}

std::vector<std::vector<int>> Space::neighbours(const std::vector<int>& d) const {
  LOOM_CHECK(complete(d)) << "plan search: neighbours of an incomplete decision sequence";
  std::vector<std::vector<int>> out;
  auto add = [&](std::vector<int> n) {
    if (!n.empty() && n != d && std::find(out.begin(), out.end(), n) == out.end())
      out.push_back(std::move(n));
  };
  for (size_t i = d.size(); i-- > 0;) {
    const std::vector<int> prefix(d.begin(), d.begin() + long(i));
    for (int o : options(prefix)) {
      if (o == d[i]) continue;
      std::vector<int> n = prefix;
      n.push_back(o);
      if (complete_with(*this, n, [&](size_t j) { return j < d.size() ? d[j] : -1; }))
        add(std::move(n));
    }
  }
  const std::vector<int64_t>& sizes = meshes_[size_t(d[0])];
  const size_t axes = sizes.size();
  const std::vector<int> roles(d.begin() + 1, d.begin() + 1 + long(axes));
  const std::vector<int> tail(d.begin() + 1 + long(axes), d.end());
  for (size_t a = 0; a < axes; ++a)
    for (size_t b = a + 1; b < axes; ++b) {
      std::vector<int64_t> s2 = sizes;
      std::vector<int> r2 = roles;
      std::swap(s2[a], s2[b]);
      std::swap(r2[a], r2[b]);
      add(with_axes(s2, r2, tail));
    }
  for (size_t a = 0; a < axes; ++a)
    for (size_t b = a + 1; b < axes; ++b)
      for (size_t place : {a, b})
        for (int role : {roles[a], roles[b]}) {
          std::vector<int64_t> s2;
          std::vector<int> r2;
          for (size_t x = 0; x < axes; ++x) {
            if (x == place) {
              s2.push_back(sizes[a] * sizes[b]);
              r2.push_back(role);
            } else if (x != a && x != b) {
              s2.push_back(sizes[x]);
              r2.push_back(roles[x]);
            }
          }
          add(with_axes(s2, r2, tail));
        }
  return out;
}

}  // namespace loom::search
