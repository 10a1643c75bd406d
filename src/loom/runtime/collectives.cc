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

// A local tensor viewed as (outer, size[d], inner) around dim d, in bytes.
struct DimView {
  int64_t outer = 1, dim = 1, inner = 1;  // inner in bytes
};

DimView view(const ir::TensorType& t, int64_t d) {
  DimView v;
  for (int64_t i = 0; i < d; ++i) v.outer *= t.shape[size_t(i)];
  v.dim = t.shape[size_t(d)];
  v.inner = int64_t(dtype_size(t.dtype));
  for (size_t i = size_t(d) + 1; i < t.shape.size(); ++i) v.inner *= t.shape[i];
  return v;
}

// Copies block j of n along the viewed dim of `src` (outer, n*b, inner) to contiguous `dst`
// (outer, b, inner), or back (unpack).
void pack_block(const char* src, char* dst, const DimView& v, int64_t n, int64_t j) {
  const int64_t b = v.dim / n * v.inner;
  for (int64_t o = 0; o < v.outer; ++o)
    std::memcpy(dst + o * b, src + (o * n + j) * b, size_t(b));
}
void unpack_block(const char* src, char* dst, const DimView& v, int64_t n, int64_t j) {
  const int64_t b = v.dim * v.inner;  // v describes the block here
  for (int64_t o = 0; o < v.outer; ++o)
    std::memcpy(dst + (o * n + j) * b, src + o * b, size_t(b));
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
    DimView v = view(in, n.attr_int("dim"));
    if (v.outer == 1) {
      c.all_gather(src, dst, in_bytes);
    } else {
      scratch.resize(size_t(in_bytes * p));
      c.all_gather(src, scratch.data(), in_bytes);
      for (int64_t j = 0; j < p; ++j) unpack_block(scratch.data() + j * in_bytes, dst, v, p, j);
    }
  } else if (n.op == "reduce_scatter") {
    DimView v = view(in, n.attr_int("dim"));
    const int64_t count = numel(out.shape);
    if (v.outer == 1) {
      c.reduce_scatter(src, dst, count, in.dtype);
    } else {
      const int64_t block = in_bytes / p;
      scratch.resize(size_t(in_bytes));
      for (int64_t j = 0; j < p; ++j) pack_block(src, scratch.data() + j * block, v, p, j);
      c.reduce_scatter(scratch.data(), dst, count, in.dtype);
    }
  } else if (n.op == "shard_slice") {
    pack_block(src, dst, view(in, n.attr_int("dim")), p, c.rank());
  } else if (n.op == "all_to_all") {
    const int64_t sd = n.attr_int("split_dim"), cd = n.attr_int("concat_dim");
    DimView vs = view(in, sd), vc = view(out, cd);
    const int64_t block = in_bytes / p;
    scratch.resize(size_t(2 * in_bytes));
    char* send = scratch.data();
    char* recv = scratch.data() + in_bytes;
    for (int64_t j = 0; j < p; ++j) pack_block(src, send + j * block, vs, p, j);
    c.all_to_all(send, recv, block);
    DimView piece = vc;
    piece.dim = vc.dim / p;
    for (int64_t i = 0; i < p; ++i) unpack_block(recv + i * block, dst, piece, p, i);
  } else {
    LOOM_CHECK(false) << "not a collective: " << n.op;
  }
}

}  // namespace loom::runtime
