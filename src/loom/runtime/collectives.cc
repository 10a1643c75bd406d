#include "loom/runtime/collectives.h"

#include <fmt/format.h>

#include <cstring>

#include "loom/core/error.h"

namespace loom::runtime {

MeshComms::MeshComms(comm::Communicator& world, const shard::Mesh& mesh) : world_(world) {
  if (mesh.size() != world.size())
    throw Error(fmt::format("the mesh has {} ranks, the communicator {}", mesh.size(), world.size()));
  const int r = world.rank();
  for (const auto& [name, n] : mesh.axes()) {
    const int64_t coord = mesh.coord(r, name);
    // ranks sharing every other coordinate: the rank with this axis's coordinate zeroed names them
    axes_[name] = world.split(int(r - coord * mesh.stride(name)), int(coord));
  }
}

comm::Communicator& MeshComms::axis(const std::string& name) const {
  auto it = axes_.find(name);
  LOOM_CHECK(it != axes_.end()) << "no communicator for mesh axis " << name;
  return *it->second;
}

bool is_collective(const std::string& op) {
  return op == "all_gather" || op == "reduce_scatter" || op == "all_reduce" || op == "all_to_all" ||
         op == "shard_slice";
}

namespace {

// A tensor split into p equal blocks along dim d, seen as (outer, p, block) with block in bytes: the
// strided side of a collective (the whole tensor an all_gather makes, a reduce_scatter or
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

void run_collective(const ir::Graph& g, const ir::Node& n, void* const* ins, void* const* outs,
                    const MeshComms& comms) {
  const ir::TensorType& in = g.value(n.inputs[0]).type;
  const ir::TensorType& out = g.value(n.outputs[0]).type;
  comm::Communicator& c = comms.axis(n.attr_str("axis"));
  const int64_t in_bytes = numel(in.shape) * int64_t(dtype_size(in.dtype));
  const char* src = static_cast<const char*>(ins[0]);
  char* dst = static_cast<char*>(outs[0]);
  const int64_t p = c.size();
  std::vector<char> scratch;

  if (n.op == "all_reduce") {
    if (src != dst) std::memmove(dst, src, size_t(in_bytes));
    c.all_reduce(dst, numel(in.shape), in.dtype);
  } else if (n.op == "all_gather") {
    Blocks b = blocks(out, n.attr_int("dim"), p);
    if (b.outer == 1) {
      c.all_gather(src, dst, in_bytes);
    } else {
      scratch.resize(size_t(in_bytes * p));
      c.all_gather(src, scratch.data(), in_bytes);
      for (int64_t j = 0; j < p; ++j) unpack_block(scratch.data() + j * in_bytes, dst, b, p, j);
    }
  } else if (n.op == "reduce_scatter") {
    Blocks b = blocks(in, n.attr_int("dim"), p);
    const int64_t count = numel(out.shape);
    if (b.outer == 1) {
      c.reduce_scatter(src, dst, count, in.dtype);
    } else {
      const int64_t piece = in_bytes / p;
      scratch.resize(size_t(in_bytes));
      for (int64_t j = 0; j < p; ++j) pack_block(src, scratch.data() + j * piece, b, p, j);
      c.reduce_scatter(scratch.data(), dst, count, in.dtype);
    }
  } else if (n.op == "shard_slice") {
    pack_block(src, dst, blocks(in, n.attr_int("dim"), p), p, c.rank());
  } else if (n.op == "all_to_all") {
    Blocks sent = blocks(in, n.attr_int("split_dim"), p), got = blocks(out, n.attr_int("concat_dim"), p);
    const int64_t piece = in_bytes / p;
    scratch.resize(size_t(2 * in_bytes));
    char* send = scratch.data();
    char* recv = scratch.data() + in_bytes;
    for (int64_t j = 0; j < p; ++j) pack_block(src, send + j * piece, sent, p, j);
    c.all_to_all(send, recv, piece);
    for (int64_t i = 0; i < p; ++i) unpack_block(recv + i * piece, dst, got, p, i);
  } else {
    LOOM_CHECK(false) << "not a collective: " << n.op;
  }
}

}  // namespace loom::runtime
