#include "loom/train/sharded_checkpoint.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "loom/core/error.h"
#include "loom/core/file.h"

namespace loom::train {

namespace fs = std::filesystem;

std::string rank_file_name(int64_t rank) { return fmt::format("rank-{:05d}.safetensors", rank); }

bool is_sharded_checkpoint(const std::string& dir) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(dir) / kShardedIndex, ec);
}

bool writes_block(const shard::Sharding& s, const shard::Mesh& mesh, int64_t rank) {
  for (const auto& [axis, size] : mesh.axes())
    if (!s.uses(axis) && mesh.coord(rank, axis) != 0) return false;
  return true;
}

std::vector<TensorToWrite> rank_file_tensors(const std::vector<HeldTensor>& held,
                                             const shard::Mesh& mesh, int64_t rank) {
  std::vector<TensorToWrite> mine;
  for (const HeldTensor& t : held)
    if (writes_block(t.sharding, mesh, rank))
      mine.push_back({t.name, DType::f32, shard::local_shape(t.grid, t.sharding, mesh), t.data});
  return mine;
}

nlohmann::json sharded_index(const std::vector<HeldTensor>& held, const shard::Mesh& mesh) {
  nlohmann::json axes = nlohmann::json::array();
  for (const auto& [axis, size] : mesh.axes()) axes.push_back({axis, size});
  nlohmann::json parts = {{"model", nlohmann::json::object()},
                          {"optimizer", nlohmann::json::object()}};
  for (const HeldTensor& t : held) {
    std::vector<int64_t> ranks;
    for (int64_t r = 0; r < mesh.size(); ++r)
      if (writes_block(t.sharding, mesh, r)) ranks.push_back(r);
    parts.at(t.part)[t.name] = {{"dtype", "f32"},
                                {"shape", t.stored},
                                {"grid", t.grid},
                                {"sharding", shard::to_string(t.sharding)},
                                {"ranks", ranks}};
  }
  return {{"format", kShardedFormat},
          {"mesh", axes},
          {"model", parts["model"]},
          {"optimizer", parts["optimizer"]}};
}

namespace {

// A JSON array of non-negative integers (a shape) of at most 2^40 elements in all, or an error
// naming `what`.
Shape shape_of(const nlohmann::json& j, const std::string& what) {
  if (!j.is_array() || j.size() > 16) throw Error(what + " is not an array of at most 16 sizes");
  Shape s;
  int64_t n = 1;
  for (const auto& x : j) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0 || x.get<int64_t>() > (int64_t(1) << 40))
      throw Error(what + " is not an array of sizes in [0, 2^40]");
    s.push_back(x.get<int64_t>());
    if (s.back() > 0 && n > (int64_t(1) << 40) / s.back())
      throw Error(what + " holds more than 2^40 elements");
    n *= s.back();
  }
  return s;
}

}  // namespace

std::shared_ptr<ShardedCheckpoint> ShardedCheckpoint::open(const std::string& dir,
                                                           const std::string& part) {
  auto c = std::make_shared<ShardedCheckpoint>();
  c->dir_ = dir;
  c->index_path_ = (fs::path(dir) / kShardedIndex).string();
  const std::string& ip = c->index_path_;
  const nlohmann::json j = read_json(ip);
  if (!j.is_object() || j.value("format", nlohmann::json()) != kShardedFormat)
    throw Error(fmt::format("{}: not a sharded checkpoint index (\"format\" is not \"{}\")", ip,
                            kShardedFormat));
  for (const char* key : {"model", "optimizer"})
    if (!j.contains(key) || !j[key].is_object())
      throw Error(fmt::format("{}: no \"{}\" object", ip, key));
  if (!j.contains("mesh") || !j["mesh"].is_array())
    throw Error(fmt::format("{}: no \"mesh\" array", ip));
  std::vector<std::pair<std::string, int64_t>> axes;
  int64_t ranks = 1;
  for (const auto& a : j["mesh"]) {
    if (!a.is_array() || a.size() != 2 || !a[0].is_string() || !a[1].is_number_integer() ||
        a[1].get<int64_t>() < 1 || a[1].get<int64_t>() > (int64_t(1) << 24))
      throw Error(
          fmt::format("{}: mesh entry {} is not [\"axis\", size in [1, 2^24]]", ip, a.dump()));
    axes.push_back({a[0].get<std::string>(), a[1].get<int64_t>()});
    ranks *= axes.back().second;
    if (ranks > (int64_t(1) << 24))
      throw Error(fmt::format("{}: the mesh has more than 2^24 ranks", ip));
  }
  c->mesh_ = shard::Mesh(axes, ip + ": mesh");
  // both parts are checked (a rank file holds blocks of both); `part` is the one served
  std::map<std::string, Entry> entries;
  for (const auto& [key, tensors] : j.items()) {
    if (key != "model" && key != "optimizer") continue;
    for (const auto& [name, t] : tensors.items()) {
      const std::string where = fmt::format("{}: {}[\"{}\"]", ip, key, name);
      if (entries.count(name))
        throw Error(fmt::format("{}: '{}' is in both model and optimizer", ip, name));
      if (!t.is_object() || t.value("dtype", nlohmann::json()) != "f32")
        throw Error(where + ": not an object with \"dtype\": \"f32\"");
      Entry e;
      e.stored = shape_of(t.value("shape", nlohmann::json()), where + ".shape");
      e.grid = shape_of(t.value("grid", nlohmann::json()), where + ".grid");
      if (numel(e.stored) != numel(e.grid))
        throw Error(fmt::format("{}: shape {} and grid {} hold different numbers of elements",
                                where, shape_str(e.stored), shape_str(e.grid)));
      if (!t.contains("sharding") || !t["sharding"].is_string())
        throw Error(where + ": no \"sharding\" string");
      e.sharding = shard::parse_sharding(t["sharding"].get<std::string>(), where + ".sharding");
      if (const std::string why = shard::check_sharding(e.grid, e.sharding, c->mesh_); !why.empty())
        throw Error(fmt::format("{}.sharding: {}", where, why));
      if (!e.sharding.partial.empty())
        throw Error(where + ".sharding: a partial sum is not stored");
      // the ranks: exactly the writers of the blocks, one per block
      std::vector<int64_t> want;
      for (int64_t r = 0; r < c->mesh_.size(); ++r)
        if (writes_block(e.sharding, c->mesh_, r)) want.push_back(r);
      if (!t.contains("ranks") || !t["ranks"].is_array())
        throw Error(where + ": no \"ranks\" array");
      for (const auto& r : t["ranks"]) {
        if (!r.is_number_integer()) throw Error(where + ".ranks: not an array of integers");
        e.ranks.push_back(r.get<int64_t>());
      }
      if (e.ranks != want)
        throw Error(fmt::format("{}.ranks: {} is not the blocks' writers under {} on {} ({})",
                                where, t["ranks"].dump(), shard::to_string(e.sharding),
                                c->mesh_.to_string(), nlohmann::json(want).dump()),
                    "the index disagrees with itself: restore the checkpoint or resume from an "
                    "earlier one");
      if (key == part) c->names_.push_back(name);
      entries[name] = std::move(e);
    }
  }
  // every rank file the index names, and every block in it as the index says
  std::map<int64_t, std::set<std::string>> listed;  // rank -> the tensors its file must hold
  for (const auto& [name, e] : entries)
    for (int64_t r : e.ranks) listed[r].insert(name);
  for (const auto& [r, names] : listed) {
    const std::string f = (fs::path(dir) / rank_file_name(r)).string();
    if (!path_exists(f))
      throw Error(fmt::format("{}: rank {}'s file {} is missing (the index lists {} of its blocks, "
                              "e.g. '{}')",
                              ip, r, f, names.size(), *names.begin()),
                  "copy every rank's file into the checkpoint, or resume from an earlier one");
    SafetensorsFile file = SafetensorsFile::open_lazy(f);
    for (const std::string& n : file.names())
      if (!names.count(n))
        throw Error(fmt::format("{}: holds '{}', which {} does not list for rank {}", f, n, ip, r));
    for (const std::string& n : names) {
      if (!file.contains(n))
        throw Error(fmt::format("{}: no block of '{}', which {} lists for rank {}", f, n, ip, r));
      const Entry& e = entries.at(n);
      const Shape block = shard::local_shape(e.grid, e.sharding, c->mesh_);
      const TensorView& v = file.get(n);
      if (v.dtype != DType::f32 || v.shape != block)
        throw Error(fmt::format("{}: block '{}' is {}{}, the index makes it f32{}", f, n,
                                dtype_name(v.dtype), shape_str(v.shape), shape_str(block)));
    }
    c->files_.emplace(r, std::move(file));
  }
  for (const std::string& n : c->names_) c->entries_[n] = entries.at(n);
  return c;
}

namespace {

// Where rank `rank`'s block of a tensor of `grid` kept under `s` on `m` lies: its first index and
// its extent in each dim.
struct Box {
  Shape at, size;
};
Box block_box(const Shape& grid, const shard::Sharding& s, const shard::Mesh& m, int64_t rank) {
  Box b{Shape(grid.size()), shard::local_shape(grid, s, m)};
  for (size_t d = 0; d < grid.size(); ++d) b.at[d] = shard::block_index(s, m, d, rank) * b.size[d];
  return b;
}

// Copies the overlap of boxes `from` (row-major data `src`) and `to` (into `dst`), both within one
// grid, row by row of the innermost dim.
void copy_overlap(const Box& from, const float* src, const Box& to, float* dst) {
  const size_t n = from.at.size();
  Shape lo(n), hi(n);
  for (size_t d = 0; d < n; ++d) {
    lo[d] = std::max(from.at[d], to.at[d]);
    hi[d] = std::min(from.at[d] + from.size[d], to.at[d] + to.size[d]);
    if (lo[d] >= hi[d]) return;  // no overlap
  }
  if (n == 0) {
    *dst = *src;
    return;
  }
  Shape i = lo;  // the overlap's current row (the last dim runs whole)
  const int64_t run = hi[n - 1] - lo[n - 1];
  while (true) {
    int64_t fs = 0, ts = 0;  // offsets within each box, row-major
    for (size_t d = 0; d < n; ++d) {
      fs = fs * from.size[d] + (i[d] - from.at[d]);
      ts = ts * to.size[d] + (i[d] - to.at[d]);
    }
    std::copy(src + fs, src + fs + run, dst + ts);
    size_t d = n - 1;  // the next row: count up the outer dims
    while (d > 0) {
      --d;
      if (++i[d] < hi[d]) break;
      i[d] = lo[d];
      if (d == 0) return;
    }
    if (n == 1) return;
  }
}

}  // namespace

const Shape& ShardedCheckpoint::grid(const std::string& name) const {
  auto e = entries_.find(name);
  if (e == entries_.end()) throw Error(fmt::format("{}: no tensor '{}'", index_path_, name));
  return e->second.grid;
}

void ShardedCheckpoint::read_block(const std::string& name, const shard::Sharding& sharding,
                                   const shard::Mesh& mesh, int64_t rank, float* dst) const {
  auto e = entries_.find(name);
  if (e == entries_.end()) throw Error(fmt::format("{}: no tensor '{}'", index_path_, name));
  const Shape& grid = e->second.grid;
  const Box want = block_box(grid, sharding, mesh, rank);
  std::vector<float> block;
  for (int64_t r : e->second.ranks) {
    const Box have = block_box(grid, e->second.sharding, mesh_, r);
    bool overlaps = true;
    for (size_t d = 0; d < grid.size(); ++d)
      overlaps = overlaps && have.at[d] < want.at[d] + want.size[d] &&
                 want.at[d] < have.at[d] + have.size[d];
    if (!overlaps) continue;
    block.resize(size_t(numel(have.size)));
    files_.at(r).read(name, block.data());
    copy_overlap(have, block.data(), want, dst);
  }
}

const TensorView& ShardedCheckpoint::get(const std::string& name) const {
  if (auto it = whole_.find(name); it != whole_.end()) return it->second.second;
  auto e = entries_.find(name);
  if (e == entries_.end()) throw Error(fmt::format("{}: no tensor '{}'", index_path_, name));
  auto& [buf, view] = whole_[name];
  buf.resize(size_t(numel(e->second.grid)));
  read_block(name, shard::Sharding::replicated(e->second.grid.size()), shard::Mesh(), 0,
             buf.data());
  view = {DType::f32, e->second.stored, buf.data(), buf.size() * 4};
  return view;
}

}  // namespace loom::train
