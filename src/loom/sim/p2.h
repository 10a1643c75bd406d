// P² (Xue et al., arXiv 2110.10548): synthesizing hierarchical reductions from a placement.
//
// A placement maps each mesh axis onto the cluster's levels: the axis's size is the product of its
// shares of each level (P²'s parallelism matrix). Mesh {x = 8, y = 4} on 4 nodes of 8 GPUs can put
// x's 8 inside a node and y across nodes, or x as 2 in a node times 4 across, y inside; each share
// larger than 1 is a Factor. Loom's own meshes are row-major with the last axis innermost
// (sim::place), one of these placements; P² ranges over all.
//
// A reduction sums a buffer over a set of axes (their factors), leaving every rank the whole sum.
// Besides the flat all_reduce over the whole group, a program is a sequence of collectives
// (all_reduce, reduce_scatter, all_gather, reduce, broadcast), each over the sub-group of some of
// the reduced factors: e.g. reduce_scatter inside the node, all_reduce across nodes on the
// scattered piece, all_gather inside the node. synthesize() enumerates programs of a few steps,
// pruned by an abstract state (which factors are summed, the stack of factors the buffer is
// scattered over, which are held by a root only), and keeps those a concrete symbolic run accepts:
// every rank of one reduction group is simulated, holding per chunk of the buffer the set of ranks
// whose inputs its value sums (or nothing); a collective over members holding different chunks,
// summing one input twice, or gathering pieces out of their order is refused, and the program must
// end with every rank holding every chunk summed over the whole group. (The abstract state only
// prunes: the symbolic run decides.)
//
// Cost: a collective over a sub-group of n ranks runs as a ring on the outermost level its factors
// touch (collective_seconds for all_reduce, reduce_scatter and all_gather; reduce and
// broadcast as pipelined chains, B/β + (n-1)α), on the bytes each rank holds at that step. The
// flat all_reduce is costed as Loom's simulator costs an axis's all_reduce today: one ring over the
// whole group on its outermost level. Collectives of one step run on disjoint groups at once;
// where a level's link is shared by several devices (Level::shared_by: one NIC per host), the
// groups that cross it from those devices at once divide its bandwidth (cost.h's link load, for a
// ring that visits an inner group's members one after another).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "loom/shard/sharding.h"
#include "loom/sim/cluster.h"

namespace loom::sim::p2 {

struct Factor {
  int axis = 0;        // index into the mesh's axes
  int level = 0;       // index into the cluster's levels
  int64_t size = 1;    // > 1
  int64_t stride = 1;  // the digit of the axis's coordinate it is: (coord / stride) % size
};

// Every placement of a mesh of these axis sizes onto `devices` devices of the cluster's levels
// (each level's size, the outermost taking the rest), as lists of factors, innermost level first.
std::vector<std::vector<Factor>> placements(const std::vector<int64_t>& axes, const Cluster& c,
                                            int64_t devices);
// The factors of `axis` in Loom's own placement of `mesh` (row-major, the last axis innermost):
// its coordinate's digits, lowest first, each on the level that holds it.
std::vector<Factor> axis_factors(const shard::Mesh& mesh, const Cluster& c,
                                 const std::string& axis);
// The factors of a reduction over `axes`: each axis's axis_factors, in the order given.
std::vector<Factor> reduction_factors(const shard::Mesh& mesh, const Cluster& c,
                                      const std::vector<std::string>& axes);
// A sub-group as a collective's `axis` attribute names it (shard::Mesh::parse_group): the digits
// of `group` (a set of factors), "y+x[1:4]", most significant first (the ranks in mesh order), an
// axis all of whose digits are in the group by its name. (Which rank is which member changes no
// sum, only a ring's neighbours: a flat all-reduce over x = 4 on two hosts named
// "x[1:2]+x[2:2]" put the hosts' ranks in turn around the ring and ran at half speed.)
std::string group_spec(const shard::Mesh& mesh, const std::vector<Factor>& f, uint32_t group);

enum class Coll { all_reduce, reduce_scatter, all_gather, reduce, broadcast };
const char* coll_name(Coll c);

struct Step {
  Coll op = Coll::all_reduce;
  uint32_t group = 0;  // a set of factors (bit i: factor i)
};

struct Program {
  std::vector<Step> steps;
  double seconds = 0;
  std::string text(const std::vector<Factor>& f, const std::vector<std::string>& axes) const;
};

// Whether `p` reduces over the factors in `reduce` leaving every rank the whole sum, by the
// symbolic run above (why not, in `why`, when it says no).
bool valid(const Program& p, const std::vector<Factor>& f, uint32_t reduce,
           std::string* why = nullptr);

// Whether the reduce_scatters of `p` cut a buffer of `numel` elements into whole pieces.
bool splits_evenly(const Program& p, const std::vector<Factor>& f, int64_t numel);

// The seconds of `p` on `bytes` (each rank's whole buffer) under the placement.
double seconds(const Program& p, const std::vector<Factor>& f, double bytes, const Cluster& c);
// The flat all_reduce over the factors in `reduce`, as the simulator costs one today.
double flat_seconds(const std::vector<Factor>& f, uint32_t reduce, double bytes, const Cluster& c);

// Every valid program of at most `max_steps` collectives over the factors in `reduce` (the flat
// all_reduce among them), costed and sorted fastest first.
// `rooted`: reduce and broadcast too (the runtime has neither yet: lowering asks without them).
std::vector<Program> synthesize(const std::vector<Factor>& f, uint32_t reduce, double bytes,
                                const Cluster& c, int max_steps = 5, bool rooted = true);

}  // namespace loom::sim::p2
