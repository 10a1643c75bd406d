#include "loom/sim/cluster.h"

#include <fmt/format.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <sstream>

#include "loom/core/error.h"
#include "loom/core/file.h"
#include "loom/core/suggest.h"

namespace loom::sim {

namespace {

// A TOML table read strictly: a key it does not know is an error naming it (with a suggestion)
// before any other, so a misspelt key is reported as such rather than as a missing one.
class Reader {
 public:
  Reader(const toml::table& t, std::string where, const std::string& source,
         const std::vector<std::string>& known)
      : t_(t), where_(std::move(where)), source_(source) {
    for (const auto& [k, v] : t_) {
      const std::string key(k.str());
      if (std::find(known.begin(), known.end(), key) == known.end())
        fail(key, "unknown key; " + suggest(key, known));
    }
  }

  [[noreturn]] void fail(const std::string& key, const std::string& why) const {
    throw Error(
        fmt::format("{}: {}{}: {}", source_, where_.empty() ? "" : "[" + where_ + "] ", key, why));
  }
  bool has(const std::string& key) const { return t_.get(key) != nullptr; }
  const toml::node* get(const std::string& key, bool required) {
    const toml::node* n = t_.get(key);
    if (!n && required) fail(key, "missing");
    return n;
  }
  // A number in [min, max]: each key's max is what a machine can have (a value past it, 1e300 s
  // of kernel overhead, made predictions of 300 digits)
  double number(const std::string& key, bool required, double fallback, double min, double max) {
    const toml::node* n = get(key, required);
    if (!n) return fallback;
    if (!n->is_number()) fail(key, "expected a number");
    const double v = *n->value<double>();
    if (!std::isfinite(v) || !(v >= min) || !(v <= max))
      fail(key, fmt::format("must be a finite number in [{}, {}], got {}", min, max, v));
    return v;
  }
  int64_t integer(const std::string& key, bool required, int64_t fallback, int64_t min,
                  int64_t max) {
    const toml::node* n = get(key, required);
    if (!n) return fallback;
    if (!n->is_integer()) fail(key, "expected an integer");
    const int64_t v = *n->value<int64_t>();
    if (v < min || v > max) fail(key, fmt::format("must be in [{}, {}], got {}", min, max, v));
    return v;
  }
  std::string string(const std::string& key, bool required, const std::string& fallback = "") {
    const toml::node* n = get(key, required);
    if (!n) return fallback;
    if (!n->is_string()) fail(key, "expected a string");
    return *n->value<std::string>();
  }
  const toml::table* table(const std::string& key, bool required) {
    const toml::node* n = get(key, required);
    if (!n) return nullptr;
    if (!n->is_table()) fail(key, "expected a table");
    return n->as_table();
  }
  const toml::array* array(const std::string& key, bool required) {
    const toml::node* n = get(key, required);
    if (!n) return nullptr;
    if (!n->is_array()) fail(key, "expected an array");
    return n->as_array();
  }

 private:
  const toml::table& t_;
  std::string where_;
  const std::string& source_;
};

DType dtype_at(const toml::node& n, const std::string& source, const std::string& where) {
  DType t;
  if (!n.is_string() || !parse_dtype(*n.value<std::string>(), &t))
    throw Error(fmt::format("{}: [{}]: expected a dtype (\"f32\", \"bf16\")", source, where));
  return t;
}

// A row of a [profile] array: numbers (and one dtype string), `count` of them, or `count` to `most`
// where most > count (an optional last column).
std::vector<const toml::node*> row(const toml::node& n, size_t count, const std::string& source,
                                   const std::string& where, size_t most = 0) {
  const toml::array* a = n.as_array();
  most = std::max(most, count);
  if (!a || a->size() < count || a->size() > most)
    throw Error(
        fmt::format("{}: [{}]: each entry is an array of {} values", source, where,
                    most > count ? fmt::format("{} or {}", count, most) : std::to_string(count)));
  std::vector<const toml::node*> r;
  for (const auto& x : *a) r.push_back(&x);
  return r;
}

// A number of a [profile] row, finite and in [min, max] (sizes and seconds a machine can have).
double num_at(const toml::node* n, const std::string& source, const std::string& where,
              double min = 0, double max = 1e18) {
  if (!n->is_number() || !std::isfinite(*n->value<double>()) || !(*n->value<double>() >= min) ||
      !(*n->value<double>() <= max))
    throw Error(
        fmt::format("{}: [{}]: expected a finite number in [{}, {}]", source, where, min, max));
  return *n->value<double>();
}
// An integer of a [profile] row in [min, max].
int64_t int_at(const toml::node* n, const std::string& source, const std::string& where,
               int64_t min, int64_t max) {
  if (!n->is_integer() || *n->value<int64_t>() < min || *n->value<int64_t>() > max)
    throw Error(fmt::format("{}: [{}]: expected an integer in {}..{}", source, where, min, max));
  return *n->value<int64_t>();
}

// The op a [profile.ops] or [profile.comm] key names: an unknown one is an error naming the key.
ir::Op profile_op(std::string_view key, const std::string& source, const std::string& where) {
  try {
    return ir::parse_op(key);
  } catch (const Error& e) {
    throw Error(fmt::format("{}: [{}]: {}", source, where, e.what()));
  }
}

// A table of measured collectives ([profile.comm], a level's comm): kind -> [[ranks, bytes per
// rank, seconds], ...].
std::map<ir::Op, std::vector<CommSample>> read_comm(const toml::table& t, const std::string& where,
                                                    const std::string& source) {
  std::map<ir::Op, std::vector<CommSample>> out;
  for (const auto& [k, v] : t) {
    const std::string w = where + ".comm." + std::string(k.str());
    if (!v.is_array()) throw Error(fmt::format("{}: [{}]: expected an array", source, w));
    auto& list = out[profile_op(k.str(), source, w)];
    for (const auto& e : *v.as_array()) {
      auto f = row(e, 3, source, w);
      list.push_back({int_at(f[0], source, w, 2, int64_t(1) << 30), num_at(f[1], source, w),
                      num_at(f[2], source, w, 1e-12, 1e6)});
    }
  }
  return out;
}

// Writes a table of measured collectives, as read_comm reads it.
void write_comm(const std::map<ir::Op, std::vector<CommSample>>& comm,
                const std::function<void(const std::string&)>& line) {
  for (const auto& [op, list] : comm) {
    line(fmt::format("{} = [", op));
    for (const auto& o : list)
      line(fmt::format("  [{}, {:.6g}, {:.6g}],", o.ranks, o.bytes, o.seconds));
    line("]");
  }
}

Profile read_profile(const toml::table& t, const std::string& source) {
  Profile p;
  Reader r(t, "profile", source, {"threads", "matmul", "ops", "comm"});
  p.threads = r.integer("threads", true, 1, 1, 1 << 20);
  if (const toml::array* mm = r.array("matmul", false))
    for (const auto& e : *mm) {
      const std::string w = "profile.matmul";
      auto f = row(e, 8, source, w);
      MatmulSample s;
      const int64_t big = int64_t(1) << 40;
      s.ta = int_at(f[0], source, w, 0, 1);
      s.tb = int_at(f[1], source, w, 0, 1);
      s.batch = int_at(f[2], source, w, 1, big);
      s.m = int_at(f[3], source, w, 1, big);
      s.n = int_at(f[4], source, w, 1, big);
      s.k = int_at(f[5], source, w, 1, big);
      s.dtype = dtype_at(*f[6], source, w);
      s.seconds = num_at(f[7], source, w, 1e-12, 1e6);
      p.matmul.push_back(s);
    }
  if (const toml::table* ops = r.table("ops", false))
    for (const auto& [k, v] : *ops) {
      const std::string w = "profile.ops." + std::string(k.str());
      if (!v.is_array()) throw Error(fmt::format("{}: [{}]: expected an array", source, w));
      auto& list = p.ops[profile_op(k.str(), source, w)];
      for (const auto& e : *v.as_array()) {
        auto f = row(e, 4, source, w, 5);
        list.push_back({dtype_at(*f[0], source, w), num_at(f[1], source, w),
                        num_at(f[2], source, w), num_at(f[3], source, w, 1e-12, 1e6),
                        f.size() > 4 ? num_at(f[4], source, w) : 0.0});
      }
    }
  if (const toml::table* comm = r.table("comm", false))
    p.comm = read_comm(*comm, "profile", source);
  return p;
}

}  // namespace

Cluster parse_cluster(const std::string& text, const std::string& source) {
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    std::ostringstream os;
    os << e.description() << " (line " << e.source().begin.line << ")";
    throw Error(fmt::format("{}: not valid TOML: {}", source, os.str()));
  }
  Cluster c;
  c.source = source;
  Reader top(root, "", source,
             {"name", "devices_per_node", "devices", "pue", "carbon_intensity", "device", "level",
              "efficiency", "profile"});
  c.name = top.string("name", true);
  constexpr int64_t kDevices = int64_t(1) << 24;   // a mesh's limit ([plan] mesh)
  constexpr double kBytes = 0x1p60, kRate = 1e18;  // bytes; flop/s and bytes/s
  c.devices_per_node = top.integer("devices_per_node", true, 1, 1, kDevices);
  c.devices = top.integer("devices", false, 0, 0, kDevices);
  c.pue = top.number("pue", false, 1.0, 1.0, 10);
  c.carbon_intensity = top.number("carbon_intensity", false, 0, 0, 1e4);

  {
    const toml::table* dt = top.table("device", true);
    Reader d(*dt, "device", source,
             {"name", "peak_flops", "memory_bytes", "memory_bandwidth", "idle_watts", "peak_watts",
              "runtime_bytes", "rank_runtime_bytes", "kernel_overhead", "cores"});
    c.device.name = d.string("name", true);
    const toml::table* pf = d.table("peak_flops", true);
    Reader pr(*pf, "device.peak_flops", source, {"f32", "bf16"});
    for (const char* t : {"f32", "bf16"}) {
      DType dt2;
      parse_dtype(t, &dt2);
      // absent: the other dtype's peak (a 0 is not "absent": it would run at the other's)
      if (pr.has(t)) c.device.peak_flops[dt2] = pr.number(t, false, 0, 1e6, kRate);
    }
    if (c.device.peak_flops.empty()) d.fail("peak_flops", "needs f32 or bf16");
    c.device.memory_bytes = d.number("memory_bytes", true, 0, 1, kBytes);
    c.device.memory_bandwidth = d.number("memory_bandwidth", true, 0, 1, kRate);
    c.device.idle_watts = d.number("idle_watts", true, 0, 0, 1e6);
    c.device.peak_watts = d.number("peak_watts", true, 0, c.device.idle_watts, 1e6);
    c.device.runtime_bytes = d.number("runtime_bytes", false, 0, 0, kBytes);
    c.device.rank_runtime_bytes =
        d.number("rank_runtime_bytes", false, c.device.runtime_bytes, 0, kBytes);
    c.device.kernel_overhead = d.number("kernel_overhead", false, 0, 0, 1);
    c.device.cores = d.integer("cores", false, 0, 1, 1 << 20);  // absent: 0, not known
  }
  {
    const toml::array* ls = top.array("level", true);
    if (ls->empty()) top.fail("level", "needs at least one [[level]]");
    for (size_t i = 0; i < ls->size(); ++i) {
      const std::string where = fmt::format("level {}", i);
      if (!(*ls)[i].is_table()) top.fail("level", "expected [[level]] tables");
      Reader l(
          *(*ls)[i].as_table(), where, source,
          {"name", "size", "bandwidth", "all_reduce_bandwidth", "latency", "shared_by",
           "comm_beside_compute", "compute_beside_comm", "comm_thread_slowdown", "skew", "comm"});
      Level lv;
      lv.name = l.string("name", true);
      lv.size = l.integer("size", true, 0, 0, kDevices);
      lv.bandwidth = l.number("bandwidth", true, 0, 1, kRate);
      lv.all_reduce_bandwidth = l.number("all_reduce_bandwidth", false, 0, 1, kRate);
      lv.latency = l.number("latency", true, 0, 0, 10);
      lv.shared_by = l.integer("shared_by", false, 1, 1, kDevices);
      lv.comm_beside_compute = l.number("comm_beside_compute", false, 1, 1, 1e3);
      lv.compute_beside_comm = l.number("compute_beside_comm", false, 1, 1, 1e3);
      lv.comm_thread_slowdown = l.number("comm_thread_slowdown", false, 1, 1, 1e3);
      lv.skew = l.number("skew", false, 0, 0, 10);
      if (const toml::table* comm = l.table("comm", false))
        lv.comm = read_comm(*comm, fmt::format("level {} ({})", i, lv.name), source);
      const int64_t inner = c.levels.empty() ? 0 : c.levels.back().size;
      if (lv.shared_by > 1 && inner > 0 && inner % lv.shared_by)
        l.fail("shared_by", fmt::format("must divide the inner level's size {} (the devices that "
                                        "share a link are in one group of it)",
                                        inner));
      if (!c.levels.empty()) {
        const Level& prev = c.levels.back();
        if (prev.size == 0)
          l.fail("size", fmt::format("level \"{}\" before it already spans any number of devices",
                                     prev.name));
        if (lv.size != 0 && (lv.size <= prev.size || lv.size % prev.size))
          l.fail("size", fmt::format("must be a multiple of the inner level's size {} and larger",
                                     prev.size));
      }
      c.levels.push_back(lv);
    }
  }
  if (const toml::table* et = top.table("efficiency", false)) {
    Reader e(*et, "efficiency", source, {"matmul", "matmul_half_flops", "attention", "memory"});
    // shares of the peaks: at most 1
    c.efficiency.matmul = e.number("matmul", false, c.efficiency.matmul, 1e-3, 1);
    c.efficiency.matmul_half_flops =
        e.number("matmul_half_flops", false, c.efficiency.matmul_half_flops, 0, 1e18);
    c.efficiency.attention = e.number("attention", false, c.efficiency.attention, 1e-3, 1);
    c.efficiency.memory = e.number("memory", false, c.efficiency.memory, 1e-3, 1);
  }
  if (const toml::table* pt = top.table("profile", false)) c.profile = read_profile(*pt, source);
  return c;
}

double peak_flops(const Cluster& c, DType t) {
  auto it = c.device.peak_flops.find(t);
  return it != c.device.peak_flops.end() ? it->second : c.device.peak_flops.begin()->second;
}

Cluster load_cluster(const std::string& path) {
  std::string text;
  try {
    text = read_file(path);
  } catch (const Error& e) {
    throw Error(fmt::format("cluster file {}: {}", path, e.what()),
                "`loom calibrate` writes clusters/local.toml; clusters/ has the shipped ones");
  }
  return parse_cluster(text, path);
}

void write_cluster(const Cluster& c, const std::string& path, const std::string& header) {
  std::string s = header;
  auto line = [&](const std::string& l) { s += l + "\n"; };
  line(fmt::format("name = \"{}\"", c.name));
  line(fmt::format("devices_per_node = {}", c.devices_per_node));
  if (c.devices) line(fmt::format("devices = {}", c.devices));
  line(fmt::format("pue = {}", c.pue));
  line(fmt::format("carbon_intensity = {}", c.carbon_intensity));
  line("\n[device]");
  line(fmt::format("name = \"{}\"", c.device.name));
  std::string pf;
  for (const auto& [t, v] : c.device.peak_flops)
    pf += fmt::format("{}{} = {:.4g}", pf.empty() ? "" : ", ", dtype_name(t), v);
  line("peak_flops = { " + pf + " }");
  line(fmt::format("memory_bytes = {:.6g}", c.device.memory_bytes));
  line(fmt::format("memory_bandwidth = {:.4g}", c.device.memory_bandwidth));
  line(fmt::format("idle_watts = {:.4g}", c.device.idle_watts));
  line(fmt::format("peak_watts = {:.4g}", c.device.peak_watts));
  line(fmt::format("runtime_bytes = {:.6g}", c.device.runtime_bytes));
  if (c.device.rank_runtime_bytes >= 0 && c.device.rank_runtime_bytes != c.device.runtime_bytes)
    line(fmt::format("rank_runtime_bytes = {:.6g}", c.device.rank_runtime_bytes));
  line(fmt::format("kernel_overhead = {:.3g}", c.device.kernel_overhead));
  if (c.device.cores) line(fmt::format("cores = {}", c.device.cores));
  for (const Level& l : c.levels) {
    line("\n[[level]]");
    line(fmt::format("name = \"{}\"", l.name));
    line(fmt::format("size = {}", l.size));
    line(fmt::format("bandwidth = {:.4g}", l.bandwidth));
    if (l.all_reduce_bandwidth > 0)
      line(fmt::format("all_reduce_bandwidth = {:.4g}", l.all_reduce_bandwidth));
    line(fmt::format("latency = {:.3g}", l.latency));
    if (l.shared_by > 1) line(fmt::format("shared_by = {}", l.shared_by));
    if (l.comm_beside_compute != 1)
      line(fmt::format("comm_beside_compute = {:.4g}", l.comm_beside_compute));
    if (l.compute_beside_comm != 1)
      line(fmt::format("compute_beside_comm = {:.4g}", l.compute_beside_comm));
    if (l.comm_thread_slowdown != 1)
      line(fmt::format("comm_thread_slowdown = {:.4g}", l.comm_thread_slowdown));
    if (l.skew > 0) line(fmt::format("skew = {:.3g}", l.skew));
    if (!l.comm.empty()) {
      line("[level.comm]  # collective = [[ranks, bytes per rank, seconds], ...]");
      write_comm(l.comm, line);
    }
  }
  line("\n[efficiency]");
  line(fmt::format("matmul = {}", c.efficiency.matmul));
  line(fmt::format("matmul_half_flops = {}", c.efficiency.matmul_half_flops));
  line(fmt::format("attention = {}", c.efficiency.attention));
  line(fmt::format("memory = {}", c.efficiency.memory));
  if (c.profile) {
    const Profile& p = *c.profile;
    line("\n[profile]");
    line(fmt::format("threads = {}", p.threads));
    line("# [ta, tb, batch, m, n, k, dtype, seconds]");
    line("matmul = [");
    for (const auto& m : p.matmul)
      line(fmt::format("  [{}, {}, {}, {}, {}, {}, \"{}\", {:.6g}],", m.ta, m.tb, m.batch, m.m, m.n,
                       m.k, dtype_name(m.dtype), m.seconds));
    line("]");
    line("\n# op = [[dtype, bytes, flops, seconds(, scratch bytes where a call took some)], ...]");
    line("[profile.ops]");
    for (const auto& [op, list] : p.ops) {
      line(fmt::format("{} = [", op));
      for (const auto& o : list)
        line(fmt::format("  [\"{}\", {:.6g}, {:.6g}, {:.6g}{}],", dtype_name(o.dtype), o.bytes,
                         o.flops, o.seconds,
                         o.scratch_bytes > 0 ? fmt::format(", {:.10g}", o.scratch_bytes) : ""));
      line("]");
    }
    line("\n# collective = [[ranks, bytes per rank, seconds], ...]");
    line("[profile.comm]");
    write_comm(p.comm, line);
  }
  parse_cluster(s, path);  // what is written must read back (a bad value fails here, not later)
  write_file_atomic(path, s);
}

namespace {

// The innermost level one of whose groups holds `span` consecutive devices, or -1.
int level_holding(const Cluster& c, int64_t span) {
  for (size_t l = 0; l < c.levels.size(); ++l)
    if (c.levels[l].size == 0 || (c.levels[l].size >= span && c.levels[l].size % span == 0))
      return int(l);
  return -1;
}

}  // namespace

int group_level(const shard::Mesh& mesh, const Cluster& c, const Placement& p,
                std::string_view group) {
  if (auto it = p.level.find(std::string(group)); it != p.level.end()) return it->second;
  int level = 0;
  for (const shard::Mesh::GroupPart& part : mesh.parse_group(group)) {
    const int l = level_holding(c, mesh.stride(part.axis) * part.stride * part.size);
    level = std::max(level, l < 0 ? int(c.levels.size()) - 1 : l);
  }
  return level;
}

Placement place(const shard::Mesh& mesh, const Cluster& c, int64_t devices) {
  Placement p;
  if (devices > 0 && mesh.size() > devices)
    throw Error(fmt::format("{}: the mesh needs {} devices, the cluster has {} (devices)", c.source,
                            mesh.size(), devices));
  int64_t inner = 1;
  const auto& axes = mesh.axes();
  for (size_t i = axes.size(); i-- > 0;) {
    const auto& [axis, size] = axes[i];
    const int64_t span = inner * size;
    const int level = level_holding(c, span);
    if (level < 0)
      throw Error(
          fmt::format("{}: [[level]]: mesh axis {} spans {} devices, and no level joins groups "
                      "of that many (a level's size must be a multiple of it; the outermost, "
                      "\"{}\", joins {}); add a level or set its size = 0",
                      c.source, axis, span, c.levels.back().name, c.levels.back().size));
    p.level[axis] = level;
    inner = span;
  }
  return p;
}

}  // namespace loom::sim
