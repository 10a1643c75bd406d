#include "loom/shard/sharding.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "loom/core/error.h"

namespace loom::shard {

Mesh::Mesh(std::vector<std::pair<std::string, int64_t>> axes, const std::string& where)
    : axes_(std::move(axes)) {
  if (axes_.empty()) throw Error(where + ": a mesh needs at least one axis", "mesh = { data = 2 }");
  for (size_t i = 0; i < axes_.size(); ++i) {
    const auto& [name, n] = axes_[i];
    if (name.empty() || name == "_")
      throw Error(fmt::format("{}: axis name '{}' is not allowed", where, name));
    if (n < 1)
      throw Error(fmt::format("{}: axis {} has size {}; sizes must be >= 1", where, name, n));
    for (size_t j = 0; j < i; ++j)
      if (axes_[j].first == name)
        throw Error(fmt::format("{}: axis {} appears twice", where, name));
  }
  // the device count stays far inside int64 (ranks, strides and bytes are computed from it)
  constexpr int64_t kMaxDevices = int64_t(1) << 24;
  int64_t total = 1;
  for (const auto& [name, n] : axes_) {
    if (n > kMaxDevices / total)
      throw Error(fmt::format("{}: the mesh's sizes multiply past {} devices (at axis {} = {})",
                              where, kMaxDevices, name, n),
                  "a mesh names the devices of one plan: at most 16,777,216");
    total *= n;
  }
}

int64_t Mesh::size() const {
  int64_t n = 1;
  for (const auto& a : axes_) n *= a.second;
  return n;
}

int Mesh::index(std::string_view axis) const {
  for (size_t i = 0; i < axes_.size(); ++i)
    if (axes_[i].first == axis) return int(i);
  return -1;
}

int64_t Mesh::axis_size(std::string_view axis) const {
  int i = index(axis);
  LOOM_CHECK(i >= 0) << "no mesh axis " << axis << " in " << to_string();
  return axes_[size_t(i)].second;
}

int64_t Mesh::stride(std::string_view axis) const {
  int i = index(axis);
  LOOM_CHECK(i >= 0) << "no mesh axis " << axis << " in " << to_string();
  int64_t stride = 1;
  for (size_t j = size_t(i) + 1; j < axes_.size(); ++j) stride *= axes_[j].second;
  return stride;
}

std::vector<Mesh::GroupPart> Mesh::parse_group(std::string_view group) const {
  std::vector<GroupPart> parts;
  size_t at = 0;
  while (at <= group.size()) {
    size_t plus = group.find('+', at);
    if (plus == std::string_view::npos) plus = group.size();
    std::string_view part = group.substr(at, plus - at);
    GroupPart g;
    const size_t open = part.find('[');
    g.axis = std::string(part.substr(0, open));
    if (!has(g.axis))
      throw Error(
          fmt::format("group '{}': no axis '{}' in the mesh {}", group, g.axis, to_string()));
    const int64_t n = axis_size(g.axis);
    g.size = n;
    if (open != std::string_view::npos) {
      long long s = 0, k = 0;
      char close = 0;
      const std::string digits(part.substr(open));
      if (std::sscanf(digits.c_str(), "[%lld:%lld%c", &s, &k, &close) != 3 || close != ']' ||
          digits.back() != ']' || s < 1 || k < 1 || n % (s * k))
        throw Error(
            fmt::format("group '{}': '{}' is not a digit [stride:size] of axis {} (size {})", group,
                        part, g.axis, n));
      g.stride = s;
      g.size = k;
    }
    parts.push_back(std::move(g));
    at = plus + 1;
  }
  return parts;
}

std::string Mesh::axes_of(std::string_view group) {
  std::string s;
  bool digit = false;  // inside "[...]"
  for (char ch : group) {
    if (ch == '[') digit = true;
    if (!digit) s += ch;
    if (ch == ']') digit = false;
  }
  return s;
}

int64_t Mesh::group_size(std::string_view group) const {
  if (has(group)) return axis_size(group);  // a whole axis: every collective of a plain plan
  int64_t n = 1;
  for (const GroupPart& p : parse_group(group)) n *= p.size;
  return n;
}

int64_t Mesh::group_coord(int64_t rank, std::string_view group) const {
  int64_t c = 0;
  for (const GroupPart& p : parse_group(group))
    c = c * p.size + coord(rank, p.axis) / p.stride % p.size;
  return c;
}

int64_t Mesh::group_color(int64_t rank, std::string_view group) const {
  // the rank with every digit of the group zeroed
  int64_t r = rank;
  for (const GroupPart& p : parse_group(group))
    r -= coord(rank, p.axis) / p.stride % p.size * p.stride * stride(p.axis);
  return r;
}

int64_t Mesh::coord(int64_t rank, std::string_view axis) const {
  return (rank / stride(axis)) % axis_size(axis);
}

std::string Mesh::to_string() const {
  std::string s = "{";
  for (size_t i = 0; i < axes_.size(); ++i)
    s += fmt::format("{}{} = {}", i ? ", " : "", axes_[i].first, axes_[i].second);
  return s + "}";
}

bool Sharding::is_replicated() const {
  if (!partial.empty()) return false;
  for (const auto& d : dims)
    if (!d.empty()) return false;
  return true;
}

bool Sharding::uses(std::string_view axis) const {
  for (const auto& d : dims)
    if (std::find(d.begin(), d.end(), axis) != d.end()) return true;
  return std::find(partial.begin(), partial.end(), axis) != partial.end();
}

int64_t Sharding::ways(const Mesh& m, size_t d) const {
  int64_t n = 1;
  for (const auto& a : dims[d]) n *= m.axis_size(a);
  return n;
}

std::string to_string(const Sharding& s) {
  std::string r = "{";
  for (size_t d = 0; d < s.dims.size(); ++d) {
    if (d) r += ",";
    if (s.dims[d].empty()) r += "_";
    for (size_t i = 0; i < s.dims[d].size(); ++i) r += (i ? "+" : "") + s.dims[d][i];
  }
  if (!s.partial.empty()) {
    r += "|sum=";
    for (size_t i = 0; i < s.partial.size(); ++i) r += (i ? "+" : "") + s.partial[i];
  }
  return r + "}";
}

Sharding parse_sharding(std::string_view text, const std::string& where) {
  auto bad = [&](const std::string& why) -> Error {
    return Error(fmt::format("{}: bad sharding '{}': {}", where, text, why),
                 "write one entry per dim, e.g. {data,_,_}, {model+data,_}, {_|sum=data}");
  };
  if (text.size() < 2 || text.front() != '{' || text.back() != '}') throw bad("not in braces");
  std::string_view body = text.substr(1, text.size() - 2);
  Sharding s;
  size_t bar = body.find('|');
  std::string_view dims = body.substr(0, bar);
  auto axes = [&](std::string_view list) {
    std::vector<std::string> r;
    size_t i = 0;
    while (i <= list.size()) {
      size_t j = list.find('+', i);
      if (j == std::string_view::npos) j = list.size();
      std::string a(list.substr(i, j - i));
      if (a.empty()) throw bad("empty axis name");
      r.push_back(a);
      i = j + 1;
    }
    return r;
  };
  if (!dims.empty()) {
    size_t i = 0;
    while (i <= dims.size()) {
      size_t j = dims.find(',', i);
      if (j == std::string_view::npos) j = dims.size();
      std::string_view d = dims.substr(i, j - i);
      if (d == "_")
        s.dims.emplace_back();
      else
        s.dims.push_back(axes(d));
      i = j + 1;
    }
  }
  if (bar != std::string_view::npos) {
    std::string_view p = body.substr(bar + 1);
    if (p.substr(0, 4) != "sum=") throw bad("expected |sum=AXES");
    s.partial = axes(p.substr(4));
  }
  return s;
}

Shape local_shape(const Shape& global, const Sharding& s, const Mesh& m) {
  LOOM_CHECK(global.size() == s.dims.size())
      << "sharding " << to_string(s) << " for a shape of rank " << global.size();
  Shape r = global;
  for (size_t d = 0; d < r.size(); ++d) {
    int64_t w = s.ways(m, d);
    LOOM_CHECK(r[d] % w == 0) << "dim " << d << " of " << shape_str(global) << " by "
                              << to_string(s);
    r[d] /= w;
  }
  return r;
}

int64_t block_index(const Sharding& s, const Mesh& m, size_t d, int64_t rank) {
  int64_t b = 0;
  for (const auto& a : s.dims[d]) b = b * m.axis_size(a) + m.coord(rank, a);
  return b;
}

namespace {

// Visits every innermost row of rank's block: fn(global element offset, local element offset, row
// length).
template <class Fn>
void for_block_rows(const Shape& shape, const Sharding& s, const Mesh& m, int64_t rank, Fn fn) {
  const Shape local = local_shape(shape, s, m);
  const size_t r = shape.size();
  if (r == 0) {
    fn(0, 0, 1);
    return;
  }
  if (numel(local) == 0) return;
  std::vector<int64_t> off(r), idx(r, 0);
  for (size_t d = 0; d < r; ++d) off[d] = block_index(s, m, d, rank) * local[d];
  const int64_t row = local[r - 1];
  int64_t lpos = 0;
  while (true) {
    int64_t g = 0;
    for (size_t d = 0; d < r; ++d) g = g * shape[d] + off[d] + (d + 1 < r ? idx[d] : 0);
    fn(g, lpos, row);
    lpos += row;
    size_t d = r - 1;
    while (d > 0) {
      if (++idx[d - 1] < local[d - 1]) break;
      idx[d - 1] = 0;
      --d;
    }
    if (d == 0) return;
  }
}

}  // namespace

void copy_block(const void* global, void* local, const Shape& shape, size_t elem, const Sharding& s,
                const Mesh& m, int64_t rank) {
  const char* g = static_cast<const char*>(global);
  char* l = static_cast<char*>(local);
  for_block_rows(shape, s, m, rank, [&](int64_t go, int64_t lo, int64_t n) {
    std::memcpy(l + size_t(lo) * elem, g + size_t(go) * elem, size_t(n) * elem);
  });
}

void copy_block_back(const void* local, void* global, const Shape& shape, size_t elem,
                     const Sharding& s, const Mesh& m, int64_t rank) {
  const char* l = static_cast<const char*>(local);
  char* g = static_cast<char*>(global);
  for_block_rows(shape, s, m, rank, [&](int64_t go, int64_t lo, int64_t n) {
    std::memcpy(g + size_t(go) * elem, l + size_t(lo) * elem, size_t(n) * elem);
  });
}

std::string check_sharding(const Shape& shape, const Sharding& s, const Mesh& m) {
  if (s.dims.size() != shape.size())
    return fmt::format("{} has {} dims, the tensor {}", to_string(s), s.dims.size(), shape.size());
  std::vector<std::string> seen;
  auto see = [&](const std::string& a) -> std::string {
    if (!m.has(a)) return fmt::format("axis {} is not in the mesh {}", a, m.to_string());
    if (std::find(seen.begin(), seen.end(), a) != seen.end())
      return fmt::format("axis {} is used twice", a);
    seen.push_back(a);
    return "";
  };
  for (size_t d = 0; d < shape.size(); ++d) {
    for (const auto& a : s.dims[d])
      if (auto e = see(a); !e.empty()) return e;
    int64_t w = s.ways(m, d);
    if (shape[d] % w)
      return fmt::format("dim {} (size {}) is not divisible by {} ({})", d, shape[d], w,
                         to_string(s));
  }
  for (const auto& a : s.partial)
    if (auto e = see(a); !e.empty()) return e;
  return "";
}

}  // namespace loom::shard
