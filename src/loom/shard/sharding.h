// Mesh and Sharding: plain values that say how a tensor is laid out across ranks.
//
// A Mesh is named axes with sizes, `{data = 2, model = 2}`; rank r has coordinates r written in the
// mixed radix of the sizes, row-major (the last axis varies fastest): ranks 0,1,2,3 are (0,0),
// (0,1), (1,0), (1,1).
//
// A Sharding says, per tensor dim, which mesh axes split it (major first), and over which axes the
// value is a pending partial sum (each rank holds a summand; the value is their sum). Axes not
// named replicate. Its text form, used in the IR text of the sharded stage:
//     {data,_,_}            dim 0 split over data, dims 1 and 2 whole
//     {model+data,_}        dim 0 split over model, each model block split again over data
//     {_,_|sum=data}        whole dims, a partial sum over data
//     {}                    a replicated scalar
// Rank r's block of a dim split over axes (a1, a2) is number c(a1) * size(a2) + c(a2) of
// size(a1) * size(a2) equal blocks.
//
// Invariant: an axis appears at most once in a Sharding (in one dim, or in the partial set).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "loom/core/shape.h"

namespace loom::shard {

class Mesh {
 public:
  Mesh() = default;
  // Throws loom::Error for an empty or repeated axis name or a size < 1 (`where` names the config
  // key).
  explicit Mesh(std::vector<std::pair<std::string, int64_t>> axes,
                const std::string& where = "mesh");

  const std::vector<std::pair<std::string, int64_t>>& axes() const { return axes_; }
  int64_t size() const;  // number of ranks
  bool has(std::string_view axis) const { return index(axis) >= 0; }
  int index(std::string_view axis) const;          // -1 when absent
  int64_t axis_size(std::string_view axis) const;  // LOOM_CHECKs the axis exists
  // The coordinate of `rank` along `axis`, and how far apart in rank two neighbours on it are.
  int64_t coord(int64_t rank, std::string_view axis) const;
  int64_t stride(std::string_view axis) const;
  std::string to_string() const;  // "{data = 2, model = 2}"
  bool operator==(const Mesh&) const = default;

  // A group of ranks a collective runs over: an axis ("data"), a digit of one axis's coordinate
  // ("data[2:4]": the ranks whose data coordinates differ only in (coord / 2) % 4), or several
  // joined by '+' ("x[1:4]+y"). Members are ranked by their digits, the first part most
  // significant. Hierarchical reductions (passes/synthesize.cc) run on such sub-groups.
  struct GroupPart {
    std::string axis;
    int64_t stride = 1, size = 1;
  };
  // Throws loom::Error for an unknown axis or a digit the axis's size does not hold.
  std::vector<GroupPart> parse_group(std::string_view group) const;
  int64_t group_size(std::string_view group) const;
  // The axes of `group` joined by '+', digits dropped: a hierarchical reduction's pieces
  // ("data[1:2]", "data[2:2]") are their axis's ("data"; passes/prefetch.cc counts collectives
  // in flight per axis).
  static std::string axes_of(std::string_view group);
  // The rank's place in its group, and a number shared by the group's members only.
  int64_t group_coord(int64_t rank, std::string_view group) const;
  int64_t group_color(int64_t rank, std::string_view group) const;

 private:
  std::vector<std::pair<std::string, int64_t>> axes_;
};

struct Sharding {
  std::vector<std::vector<std::string>>
      dims;                          // per tensor dim, the axes that split it, major first
  std::vector<std::string> partial;  // sorted by mesh order

  static Sharding replicated(size_t rank) {
    return Sharding{std::vector<std::vector<std::string>>(rank), {}};
  }
  bool is_replicated() const;  // no split dim and no partial axis
  bool uses(std::string_view axis) const;
  // The number of blocks dim d is split into.
  int64_t ways(const Mesh& m, size_t d) const;
  bool operator==(const Sharding&) const = default;
};

std::string to_string(const Sharding& s);
// Parses the text form; throws loom::Error naming `where` on malformed text.
Sharding parse_sharding(std::string_view text, const std::string& where = "<sharding>");

// The shape of one rank's block. LOOM_CHECKs divisibility (check_sharding reports it to users).
Shape local_shape(const Shape& global, const Sharding& s, const Mesh& m);
// This rank's block index along dim d (0 when the dim is whole).
int64_t block_index(const Sharding& s, const Mesh& m, size_t d, int64_t rank);
// Copies `rank`'s block of a row-major global tensor of `shape` (elements of `elem` bytes) into
// `local` (its local shape), or, with to_global, back from `local` into its place in `global`.
void copy_block(const void* global, void* local, const Shape& shape, size_t elem, const Sharding& s,
                const Mesh& m, int64_t rank);
void copy_block_back(const void* local, void* global, const Shape& shape, size_t elem,
                     const Sharding& s, const Mesh& m, int64_t rank);
// "" when `s` fits a tensor of `shape` on `m`, else why not: an unknown axis, an axis used twice, a
// dim not divisible by its axes, a rank mismatch.
std::string check_sharding(const Shape& shape, const Sharding& s, const Mesh& m);

}  // namespace loom::shard
