// The cost model: how long one node of a per-rank program takes on a cluster's device, and one
// collective on a level. The simulator (simulate.h) adds these up along the program's two streams;
// bucket = "auto" (passes/bucket.cc) weighs a bucket's transfer against the compute it overlaps.
//
// A compute node: from the cluster's calibrated profile where it has samples of the op (a GEMM from
// the nearest measured shape of the same transposes and dtype, scaled by FLOPs; another op from its
// samples, interpolated log-log in bytes moved, or in FLOPs for attention), else from the
// efficiency model: a GEMM at efficiency.matmul of peak, less for small ones (half of it at
// matmul_half_flops), attention at efficiency.attention, everything else at efficiency.memory of
// the memory bandwidth; plus device.kernel_overhead per kernel. Views (reshape, wait) cost nothing.
//
// A collective over n ranks, B bytes of input per rank, on a level of bandwidth β and latency α, as
// a ring runs it (NCCL's bus-bandwidth accounting):
//   all_gather       (n-1) (α + B/β)               (B: each rank's block)
//   reduce_scatter   (n-1) (α + B/(n β))           (B: the whole buffer)
//   all_reduce       2 (n-1) (α + B/(n β)), or as a double binary tree 2 ⌈log2 n⌉ α + 2 B/β
//                    where that is faster (small buffers on many ranks)
//   all_to_all       (n-1) (α + B/(n β))
// or, where the level measured the kind at n ranks (Level::comm: `loom calibrate --level`, its
// groups all at once), that time interpolated in B; on the innermost level with a profile, the
// profile's samples of n ranks (threads of one process) where the level has none.
// Where a level's link is shared (Level::shared_by), the bandwidth term is multiplied by the
// link's load: how many of the ring edges (all_to_all: pairs, per n-1) that the collective's
// groups cross the level on at once leave or enter through one link (at least 1).
#pragma once

#include <string>
#include <string_view>

#include "loom/ir/graph.h"
#include "loom/ops/op.h"
#include "loom/sim/cluster.h"

namespace loom::sim {

// Seconds of one compute node (not a collective) on one device; `cost` is its op's ops::Cost (the
// caller has it: the simulator counts its FLOPs too).
double node_seconds(const ir::Graph& g, const ir::Node& n, const ops::Cost& cost, const Cluster& c);
// Bytes of scratch one compute node takes beside the memory plan (a GPU kernel's stream-ordered
// temporaries), from the profile's samples of its op that measured some (profile.h), interpolated
// as its time is; 0 where none did.
double node_scratch_bytes(const ir::Graph& g, const ir::Node& n, const ops::Cost& cost,
                          const Cluster& c);
// How the cost model sees an op: a GEMM (matmul, grouped_matmul: by shape, at matmul efficiency),
// costed by its FLOPs (attention and its backward), or else by the bytes it moves. The first two
// are compute-bound, the rest memory-bound.
bool is_gemm(ir::Op op);
bool by_flops(ir::Op op);
inline bool compute_bound(ir::Op op) { return is_gemm(op) || by_flops(op); }
// The dtype a node computes in: its first input's (its first output's when it has none), as the
// profile's samples are keyed.
DType node_dtype(const ir::Graph& g, const ir::Node& n);
// Seconds of one collective `op` moving `bytes` (its input, per rank) among `ranks` ranks on
// `level` (an index into c.levels).
double collective_seconds(ir::Op op, double bytes, int64_t ranks, const Cluster& c, int level,
                          double load = 1);
// The load on the busiest link of `level` when every group of `group` (an axis or a sub-group:
// shard::Mesh::parse_group) runs `op` at once, its members in group order around a ring: the ring
// edges that cross the level (join devices of different groups of the inner level; on the
// innermost, every edge) counted per link, in and out, a link being Level::shared_by consecutive
// ranks; all_to_all's pairs count 1/(n-1) each. 1 where the level's links are not shared.
double link_load(ir::Op op, const shard::Mesh& mesh, const Cluster& c, int level,
                 std::string_view group);
// The bytes one rank sends for that collective (the level's traffic).
double collective_wire_bytes(ir::Op op, double bytes, int64_t ranks);
// The communicator's own temporaries for that collective (comm/chunking.cc, comm/mpi.cc): a
// reduce_scatter or all_to_all whose per-rank block passes the 4 MiB chunk stages (ranks x chunk)
// pieces (twice for all_to_all), and MPI's polite reduce_scatter (a comm thread's) receives its
// ranks' blocks of each piece in one more such buffer.
double collective_scratch_bytes(ir::Op op, double bytes, int64_t ranks, bool mpi_polite);

}  // namespace loom::sim
