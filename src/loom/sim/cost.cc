#include "loom/sim/cost.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "loom/comm/communicator.h"
#include "loom/core/error.h"
#include "loom/ops/linear.h"
#include "loom/ops/op.h"

namespace loom::sim {

namespace {

double flops_of(const MatmulSample& s) { return 2.0 * s.batch * s.m * s.n * s.k; }

// Seconds at x from samples (x_i, t_i): piecewise linear in log-log between samples, at the last
// sample's rate (t/x) above them, and below the first at its rate (`latency_bound`: its time).
double interpolate(std::vector<std::pair<double, double>> xs, double x, bool latency_bound) {
  std::sort(xs.begin(), xs.end());
  if (x <= xs.front().first)
    return latency_bound ? xs.front().second
                         : xs.front().second * x / std::max(xs.front().first, 1.0);
  if (x >= xs.back().first) return xs.back().second * x / std::max(xs.back().first, 1.0);
  for (size_t i = 1; i < xs.size(); ++i)
    if (x <= xs[i].first) {
      const auto [x0, t0] = xs[i - 1];
      const auto [x1, t1] = xs[i];
      if (x0 <= 0 || t0 <= 0 || t1 <= 0 || x1 <= x0) return t1;
      const double f = std::log(x / x0) / std::log(x1 / x0);
      return std::exp(std::log(t0) + f * (std::log(t1) - std::log(t0)));
    }
  return xs.back().second;
}

// The GEMM's seconds from the measured ones of the same transposes and dtype: a sample of this very
// shape where there is one (the kernels `loom calibrate --import` brings), else the achieved FLOP/s
// of the nearest samples in log shape (rows with the batch folded in, columns, depth), averaged in
// log with inverse-distance weights, applied to this GEMM's FLOPs.
double matmul_from_profile(const ops::MatmulDims& d, DType t, const Profile& p) {
  std::vector<std::pair<double, double>> near;  // (distance, log FLOP/s)
  for (const MatmulSample& s : p.matmul) {
    if (s.dtype != t || s.ta != int64_t(d.ta) || s.tb != int64_t(d.tb) || s.seconds <= 0) continue;
    const double dm = std::log(double(d.batch * d.M) / double(s.batch * s.m));
    const double dn = std::log(double(d.N) / double(s.n)), dk = std::log(double(d.K) / double(s.k));
    near.push_back({std::sqrt(dm * dm + dn * dn + dk * dk), std::log(flops_of(s) / s.seconds)});
  }
  if (near.empty()) return -1;
  const size_t k = std::min<size_t>(4, near.size());
  std::partial_sort(near.begin(), near.begin() + long(k), near.end());
  const double flops = 2.0 * double(d.batch * d.M) * double(d.N) * double(d.K);
  if (near[0].first == 0) return flops / std::exp(near[0].second);
  double wsum = 0, lsum = 0;
  for (size_t i = 0; i < k; ++i) {
    const double w = 1.0 / (near[i].first + 0.05);
    wsum += w;
    lsum += w * near[i].second;
  }
  return flops / std::exp(lsum / wsum);
}

// The profile's samples of op as (size, field) pairs, those of dtype t where there are some, else
// all; a size is bytes moved, or FLOPs for an op costed by them.
std::vector<std::pair<double, double>> op_samples(ir::Op op, DType t, const Profile& p,
                                                  double OpSample::*field) {
  auto it = p.ops.find(op);
  if (it == p.ops.end()) return {};
  std::vector<std::pair<double, double>> xs, any;
  for (const OpSample& s : it->second) {
    const double x = by_flops(op) ? s.flops : s.bytes;
    any.push_back({x, s.*field});
    if (s.dtype == t) xs.push_back({x, s.*field});
  }
  return xs.empty() ? any : xs;
}

double op_size(ir::Op op, const ops::Cost& cost) {
  return by_flops(op) ? cost.flops : cost.bytes_read + cost.bytes_written;
}

double op_from_profile(ir::Op op, DType t, const ops::Cost& cost, const Profile& p) {
  const auto xs = op_samples(op, t, p, &OpSample::seconds);
  if (xs.empty()) return -1;
  return interpolate(xs, op_size(op, cost), false);
}

}  // namespace

bool is_gemm(ir::Op op) { return op == ir::Op::matmul || op == ir::Op::grouped_matmul; }
bool by_flops(ir::Op op) { return op == ir::Op::attention || op == ir::Op::attention_bwd; }

DType node_dtype(const ir::Graph& g, const ir::Node& n) {
  return n.inputs.empty() ? g.value(n.outputs[0]).type.dtype : g.value(n.inputs[0]).type.dtype;
}

double node_seconds(const ir::Graph& g, const ir::Node& n, const ops::Cost& cost,
                    const Cluster& c) {
  if (ops::has_trait(n.op, ops::Trait::view)) return 0;
  const DType t = node_dtype(g, n);
  if (c.profile) {
    double s = -1;
    if (n.op == ir::Op::matmul) s = matmul_from_profile(ops::matmul_dims(g, n), t, *c.profile);
    if (n.op == ir::Op::grouped_matmul)
      s = matmul_from_profile(ops::grouped_matmul_dims(g, n), t, *c.profile);
    if (s < 0) s = op_from_profile(n.op, t, cost, *c.profile);
    if (s < 0) s = op_from_profile(ir::Op::add, t, cost, *c.profile);  // a streaming op's bandwidth
    if (s >= 0) return std::max(s, c.device.kernel_overhead);
  }
  const Efficiency& e = c.efficiency;
  const double bytes = cost.bytes_read + cost.bytes_written;
  const double mem = bytes / (c.device.memory_bandwidth * e.memory);
  double compute = cost.flops / peak_flops(c, t);
  if (is_gemm(n.op))
    compute = cost.flops /
              (peak_flops(c, t) * e.matmul * cost.flops / (cost.flops + e.matmul_half_flops));
  else if (by_flops(n.op))
    compute = cost.flops / (peak_flops(c, t) * e.attention);
  return std::max(compute, mem) + c.device.kernel_overhead;
}

double node_scratch_bytes(const ir::Graph& g, const ir::Node& n, const ops::Cost& cost,
                          const Cluster& c) {
  if (!c.profile) return 0;
  const auto xs = op_samples(n.op, node_dtype(g, n), *c.profile, &OpSample::scratch_bytes);
  if (std::none_of(xs.begin(), xs.end(), [](const auto& s) { return s.second > 0; })) return 0;
  return interpolate(xs, op_size(n.op, cost), false);
}

double collective_wire_bytes(ir::Op op, double bytes, int64_t ranks) {
  const double n = double(ranks);
  if (ranks <= 1) return 0;
  if (op == ir::Op::all_gather) return (n - 1) * bytes;
  if (op == ir::Op::all_reduce) return 2 * (n - 1) / n * bytes;
  return (n - 1) / n * bytes;  // reduce_scatter, all_to_all
}

double collective_scratch_bytes(ir::Op op, double bytes, int64_t ranks, bool mpi_polite) {
  if (ranks <= 1) return 0;
  const double n = double(ranks), chunk = double(comm::kDefaultChunkBytes), block = bytes / n;
  if (op == ir::Op::reduce_scatter)
    return (block > chunk ? n * chunk : 0) + (mpi_polite ? n * std::min(block, chunk) : 0);
  if (op == ir::Op::all_to_all) return block > chunk ? 2 * n * chunk : 0;
  return 0;
}

double link_load(ir::Op op, const shard::Mesh& mesh, const Cluster& c, int level,
                 std::string_view group) {
  const Level& l = c.levels.at(size_t(level));
  const int64_t n = mesh.group_size(group);
  if (l.shared_by <= 1 || n <= 1) return 1;
  const int64_t ranks = mesh.size();
  const int64_t unit = level == 0 ? 1 : c.levels[size_t(level) - 1].size;  // the inner level's
  // every group's members in ring order
  std::map<int64_t, std::vector<int64_t>> rings;
  for (int64_t r = 0; r < ranks; ++r) {
    auto& ring = rings[mesh.group_color(r, group)];
    if (ring.empty()) ring.resize(size_t(n), -1);
    ring[size_t(mesh.group_coord(r, group))] = r;
  }
  std::map<int64_t, double> out, in;  // per link: crossing edges
  auto cross = [&](int64_t a, int64_t b) {
    if (a / unit == b / unit) return;
    out[a / l.shared_by] += 1;
    in[b / l.shared_by] += 1;
  };
  for (const auto& [color, ring] : rings) {
    if (op != ir::Op::all_to_all) {
      for (size_t i = 0; i < ring.size(); ++i) cross(ring[i], ring[(i + 1) % ring.size()]);
      continue;
    }
    // every member sends to (and receives from) each member outside its inner group
    std::map<int64_t, int64_t> per_unit;
    for (int64_t r : ring) per_unit[r / unit]++;
    for (int64_t r : ring) {
      const double w = double(n - per_unit[r / unit]) / double(n - 1);
      out[r / l.shared_by] += w;
      in[r / l.shared_by] += w;
    }
  }
  double load = 1;
  for (const auto* m : {&out, &in})
    for (const auto& [link, w] : *m) load = std::max(load, w);
  return load;
}

double collective_seconds(ir::Op op, double bytes, int64_t ranks, const Cluster& c, int level,
                          double load) {
  if (ranks <= 1) return 0;
  const Level& l = c.levels.at(size_t(level));
  // measured: the level's own samples of this rank count, else (innermost) the profile's
  auto measured = [&](const std::map<ir::Op, std::vector<CommSample>>& comm) {
    std::vector<std::pair<double, double>> xs;
    if (auto it = comm.find(op); it != comm.end())
      for (const CommSample& s : it->second)
        if (s.ranks == ranks) xs.push_back({s.bytes, s.seconds});
    return xs.empty() ? -1.0 : interpolate(xs, bytes, true);
  };
  if (const double t = measured(l.comm); t >= 0) return t;
  if (level == 0 && c.profile)
    if (const double t = measured(c.profile->comm); t >= 0) return t;
  const double steps = double(ranks - 1) * (op == ir::Op::all_reduce ? 2 : 1);
  const double bw =
      op == ir::Op::all_reduce && l.all_reduce_bandwidth > 0 ? l.all_reduce_bandwidth : l.bandwidth;
  const double ring = steps * l.latency + load * collective_wire_bytes(op, bytes, ranks) / bw;
  if (op != ir::Op::all_reduce) return ring;
  // a double binary tree (NCCL's other all-reduce): log-depth latency, the whole buffer up and down
  const double tree = 2 * std::ceil(std::log2(double(ranks))) * l.latency + load * 2 * bytes / bw;
  return std::min(ring, tree);
}

}  // namespace loom::sim
