#include "loom/runtime/collectives.h"

#include <fmt/format.h>

#include <array>
#include <cstring>
#include <initializer_list>
#include <map>
#include <set>

#include "loom/core/error.h"
#include "loom/ops/op.h"

namespace loom::runtime {

MeshComms::MeshComms(comm::Communicator& world, const shard::Mesh& mesh)
    : world_(world), mesh_(mesh) {
  if (mesh.size() != world.size())
    throw Error(
        fmt::format("the mesh has {} ranks, the communicator {}", mesh.size(), world.size()));
  const int r = world.rank();
  for (const auto& [name, n] : mesh.axes()) {
    const int64_t coord = mesh.coord(r, name);
    // ranks sharing every other coordinate: the rank with this axis's coordinate zeroed names them
    axes_[name] = world.split(int(r - coord * mesh.stride(name)), int(coord));
  }
}

void MeshComms::prepare(const ir::Graph& program) const {
  std::set<std::string> groups;
  for (const ir::Node& n : program.nodes())
    if (ops::has_trait(n.op, ops::Trait::collective) && !axes_.count(n.attr_str("axis")))
      groups.insert(n.attr_str("axis"));
  const int r = world_.rank();
  for (const std::string& g : groups)  // in the same (sorted) order on every rank
    axes_[g] = world_.split(int(mesh_.group_color(r, g)), int(mesh_.group_coord(r, g)));
}

comm::Communicator& MeshComms::axis(const std::string& name) const {
  auto it = axes_.find(name);
  LOOM_CHECK(it != axes_.end()) << "no communicator for mesh axis " << name;
  return *it->second;
}

namespace {

// A tensor split into p equal blocks along dim d, seen as (outer, p, block) with block in bytes:
// the strided side of a collective (the whole tensor an all_gather makes, a reduce_scatter or
// shard_slice reads).
struct Blocks {
  int64_t outer = 1, block = 1;
};

Blocks blocks(const ir::TensorType& whole, int64_t d, int64_t p) {
  Blocks b;
  for (int64_t i = 0; i < d; ++i) b.outer *= whole.shape[size_t(i)];
  b.block = whole.shape[size_t(d)] / p * int64_t(dtype_size(whole.dtype));
  for (size_t i = size_t(d) + 1; i < whole.shape.size(); ++i) b.block *= whole.shape[i];
  return b;
}

// Block j of the strided `whole` (outer, p, block) to or from contiguous `piece` (outer, block).
void pack_block(const char* whole, char* piece, const Blocks& b, int64_t p, int64_t j) {
  for (int64_t o = 0; o < b.outer; ++o)
    std::memcpy(piece + o * b.block, whole + (o * p + j) * b.block, size_t(b.block));
}
void unpack_block(const char* piece, char* whole, const Blocks& b, int64_t p, int64_t j) {
  for (int64_t o = 0; o < b.outer; ++o)
    std::memcpy(whole + (o * p + j) * b.block, piece + o * b.block, size_t(b.block));
}

}  // namespace

namespace {

// One collective node's operands, as its kernel sees them.
struct Call {
  const ir::Node& n;
  const ir::TensorType &in, &out;
  comm::Communicator& c;
  const char* src;
  char* dst;
  int64_t in_bytes, p;
  std::vector<char>& scratch;
};
using CollectiveKernel = void (*)(Call&);

// The kernel of each op with trait collective, rank_local or p2p (ops/collective.cc).
const std::array<CollectiveKernel, ir::kOpCount>& collective_kernels() {
  static const std::array<CollectiveKernel, ir::kOpCount> t = [] {
    std::array<CollectiveKernel, ir::kOpCount> k{};
    for (auto [op, f] : std::initializer_list<std::pair<ir::Op, CollectiveKernel>>{
             {ir::Op::all_reduce,
              [](Call& k) {
                if (k.src != k.dst) std::memmove(k.dst, k.src, size_t(k.in_bytes));
                k.c.all_reduce(k.dst, numel(k.in.shape), k.in.dtype);
              }},
             {ir::Op::all_gather,
              [](Call& k) {
                Blocks b = blocks(k.out, k.n.attr_int("dim"), k.p);
                if (b.outer == 1) {
                  k.c.all_gather(k.src, k.dst, k.in_bytes);
                } else {
                  k.scratch.resize(size_t(k.in_bytes * k.p));
                  k.c.all_gather(k.src, k.scratch.data(), k.in_bytes);
                  for (int64_t j = 0; j < k.p; ++j)
                    unpack_block(k.scratch.data() + j * k.in_bytes, k.dst, b, k.p, j);
                }
              }},
             {ir::Op::reduce_scatter,
              [](Call& k) {
                Blocks b = blocks(k.in, k.n.attr_int("dim"), k.p);
                const int64_t count = numel(k.out.shape);
                if (b.outer == 1) {
                  k.c.reduce_scatter(k.src, k.dst, count, k.in.dtype);
                } else {
                  const int64_t piece = k.in_bytes / k.p;
                  k.scratch.resize(size_t(k.in_bytes));
                  for (int64_t j = 0; j < k.p; ++j)
                    pack_block(k.src, k.scratch.data() + j * piece, b, k.p, j);
                  k.c.reduce_scatter(k.scratch.data(), k.dst, count, k.in.dtype);
                }
              }},
             {ir::Op::shard_slice,
              [](Call& k) {
                pack_block(k.src, k.dst, blocks(k.in, k.n.attr_int("dim"), k.p), k.p, k.c.rank());
              }},
             {ir::Op::shard_index,
              [](Call& k) {
                const int64_t block = k.n.attr_int("size") / k.p, lo = block * k.c.rank();
                const auto* ids = reinterpret_cast<const int32_t*>(k.src);
                auto* out = reinterpret_cast<int32_t*>(k.dst);
                for (int64_t i = 0, n = numel(k.in.shape); i < n; ++i)
                  out[i] = ids[i] >= lo && ids[i] < lo + block ? int32_t(ids[i] - lo) : -1;
              }},
             {ir::Op::send,
              [](Call& k) {
                k.c.send(k.src, k.in_bytes, int(k.n.attr_int("peer")), int(k.n.attr_int("tag")));
                *reinterpret_cast<int32_t*>(k.dst) = 0;
              }},
             {ir::Op::recv,
              [](Call& k) {
                k.c.recv(k.dst, k.in_bytes, int(k.n.attr_int("peer")), int(k.n.attr_int("tag")));
              }},
             {ir::Op::all_to_all,
              [](Call& k) {
                Blocks sent = blocks(k.in, k.n.attr_int("split_dim"), k.p);
                Blocks got = blocks(k.out, k.n.attr_int("concat_dim"), k.p);
                const int64_t piece = k.in_bytes / k.p;
                k.scratch.resize(size_t(2 * k.in_bytes));
                char* send = k.scratch.data();
                char* recv = k.scratch.data() + k.in_bytes;
                for (int64_t j = 0; j < k.p; ++j) pack_block(k.src, send + j * piece, sent, k.p, j);
                k.c.all_to_all(send, recv, piece);
                for (int64_t i = 0; i < k.p; ++i)
                  unpack_block(recv + i * piece, k.dst, got, k.p, i);
              }},
         })
      k[size_t(op)] = f;
    return k;
  }();
  return t;
}

}  // namespace

bool runs_on_comms(ir::Op op) {
  return ops::has_trait(op, ops::Trait::collective) || ops::has_trait(op, ops::Trait::rank_local) ||
         ops::has_trait(op, ops::Trait::p2p);
}

bool has_collective_kernel(ir::Op op) { return collective_kernels()[size_t(op)] != nullptr; }

void run_collective(const ir::Graph& g, const ir::Node& n, void* const* ins, void* const* outs,
                    const MeshComms& comms) {
  const CollectiveKernel kernel = collective_kernels()[size_t(n.op)];
  LOOM_CHECK(kernel) << "no collective kernel for " << n.op;
  // recv has no input: its output stands in (in_bytes then counts what it receives)
  const ir::TensorType& out = g.value(n.outputs[0]).type;
  const ir::TensorType& in = n.inputs.empty() ? out : g.value(n.inputs[0]).type;
  comm::Communicator& c = comms.axis(n.attr_str("axis"));
  std::vector<char> scratch;
  Call k{n,
         in,
         out,
         c,
         n.inputs.empty() ? nullptr : static_cast<const char*>(ins[0]),
         static_cast<char*>(outs[0]),
         numel(in.shape) * int64_t(dtype_size(in.dtype)),
         c.size(),
         scratch};
  kernel(k);
}

}  // namespace loom::runtime
