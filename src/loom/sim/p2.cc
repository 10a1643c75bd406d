#include "loom/sim/p2.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <functional>
#include <map>
#include <mutex>
#include <numeric>

#include "loom/core/error.h"
#include "loom/sim/cost.h"

namespace loom::sim::p2 {

namespace {

// The devices each level adds, innermost first: a level of size S inside one of size S' holds
// S' / S groups of it; the outermost takes what is left of `devices`.
std::vector<int64_t> level_widths(const Cluster& c, int64_t devices) {
  std::vector<int64_t> w;
  int64_t inner = 1;
  for (size_t l = 0; l < c.levels.size() && inner < devices; ++l) {
    const int64_t size = c.levels[l].size;
    if (size == 0 || size >= devices || l + 1 == c.levels.size()) {
      if (devices % inner)
        throw Error(
            fmt::format("{}: {} devices are not whole groups of {}", c.source, devices, inner));
      w.push_back(devices / inner);
      inner = devices;
      break;
    }
    if (size % inner) throw Error(fmt::format("{}: level {} size {}", c.source, l, size));
    w.push_back(size / inner);
    inner = size;
  }
  if (inner != devices)
    throw Error(fmt::format("{}: the levels do not hold {} devices", c.source, devices));
  return w;
}

int64_t group_size(const std::vector<Factor>& f, uint32_t g) {
  int64_t n = 1;
  for (size_t i = 0; i < f.size(); ++i)
    if (g >> i & 1) n *= f[i].size;
  return n;
}

int group_level(const std::vector<Factor>& f, uint32_t g) {
  int l = 0;
  for (size_t i = 0; i < f.size(); ++i)
    if (g >> i & 1) l = std::max(l, f[i].level);
  return l;
}

// The load on a shared link of the group's level (cost.h: link_load) with the ring visiting the
// members inside one group of the inner level one after another, as a topology-aware ring does:
// each group of `g` leaves an inner group once, and the inner group's devices hold
// (its size / the group's members in it) groups, Level::shared_by of them on one link.
double group_load(const std::vector<Factor>& f, uint32_t g, const Cluster& c) {
  const int level = group_level(f, g);
  const int64_t shared = c.levels[size_t(level)].shared_by;
  if (shared <= 1) return 1;
  int64_t inside = 1;  // the group's members in one group of the inner level
  for (size_t i = 0; i < f.size(); ++i)
    if ((g >> i & 1) && f[i].level < level) inside *= f[i].size;
  return double(std::max<int64_t>(1, (shared + inside - 1) / inside));
}

// The most ranks the symbolic run below holds: a set of ranks is a 64-bit mask.
constexpr int64_t kMaxSymbolicRanks = 64;

// The ranks of one reduction group, in mixed radix over the reduced factors (the first most
// significant); chunk c of a rank's buffer holds `sum[c]`, the set of ranks whose inputs it sums
// (0: the rank holds no value of that chunk).
class Symbolic {
 public:
  Symbolic(const std::vector<Factor>& f, uint32_t reduce) {
    for (size_t i = 0; i < f.size(); ++i)
      if (reduce >> i & 1) {
        fac_.push_back(int(i));
        size_.push_back(f[i].size);
      }
    n_ = 1;
    for (int64_t s : size_) n_ *= s;
    LOOM_CHECK(n_ <= kMaxSymbolicRanks) << "P2: a reduction over more than 64 ranks";
    sum_.assign(size_t(n_), std::vector<uint64_t>(size_t(n_), 0));
    for (int64_t r = 0; r < n_; ++r)
      for (auto& c : sum_[size_t(r)]) c = uint64_t(1) << r;
  }

  // Applies one step; false (and why) where the step is not a valid collective here.
  bool apply(const Step& s, std::string* why) {
    std::vector<int> in;  // positions (in fac_) of the group's factors
    for (size_t k = 0; k < fac_.size(); ++k)
      if (s.group >> fac_[k] & 1) in.push_back(int(k));
    if (in.empty()) return fail(why, "a step over no reduced factor");
    // members: ranks equal outside the group, ordered by their coordinates in it
    std::vector<std::vector<int64_t>> groups;
    std::vector<int64_t> seen(size_t(n_), 0);
    for (int64_t r = 0; r < n_; ++r) {
      if (seen[size_t(r)]) continue;
      std::vector<int64_t> m;
      const auto coords = coord(r);
      std::function<void(size_t, std::vector<int64_t>)> walk = [&](size_t k,
                                                                   std::vector<int64_t> c) {
        if (k == in.size()) {
          m.push_back(rank(c));
          return;
        }
        for (int64_t v = 0; v < size_[size_t(in[k])]; ++v) {
          c[size_t(in[k])] = v;
          walk(k + 1, c);
        }
      };
      walk(0, coords);
      for (int64_t x : m) seen[size_t(x)] = 1;
      groups.push_back(std::move(m));
    }
    for (const auto& m : groups)
      if (!step(s.op, m, why)) return false;
    return true;
  }

  bool done(std::string* why) const {
    const uint64_t all = n_ == kMaxSymbolicRanks ? ~uint64_t(0) : (uint64_t(1) << n_) - 1;
    for (int64_t r = 0; r < n_; ++r)
      for (int64_t c = 0; c < n_; ++c)
        if (sum_[size_t(r)][size_t(c)] != all)
          return fail(why, fmt::format("rank {} chunk {} ends {}", r, c,
                                       sum_[size_t(r)][size_t(c)] ? "a partial sum" : "missing"));
    return true;
  }

 private:
  static bool fail(std::string* why, std::string m) {
    if (why) *why = std::move(m);
    return false;
  }
  std::vector<int64_t> coord(int64_t r) const {
    std::vector<int64_t> c(size_.size());
    for (size_t k = size_.size(); k-- > 0;) {
      c[k] = r % size_[k];
      r /= size_[k];
    }
    return c;
  }
  int64_t rank(const std::vector<int64_t>& c) const {
    int64_t r = 0;
    for (size_t k = 0; k < size_.size(); ++k) r = r * size_[k] + c[k];
    return r;
  }
  std::vector<int64_t> held(int64_t r) const {
    std::vector<int64_t> h;
    for (int64_t c = 0; c < n_; ++c)
      if (sum_[size_t(r)][size_t(c)]) h.push_back(c);
    return h;
  }
  // The members' sums of each chunk they all hold; false where they hold different chunks or one
  // input would be summed twice.
  bool combine(const std::vector<int64_t>& m, std::vector<uint64_t>& out, std::string* why) {
    const auto h = held(m[0]);
    out.assign(size_t(n_), 0);
    for (int64_t x : m)
      if (held(x) != h) return fail(why, "members hold different chunks");
    for (int64_t c : h)
      for (int64_t x : m) {
        const uint64_t v = sum_[size_t(x)][size_t(c)];
        if (out[size_t(c)] & v) return fail(why, "an input summed twice");
        out[size_t(c)] |= v;
      }
    return true;
  }
  bool step(Coll op, const std::vector<int64_t>& m, std::string* why) {
    const int64_t k = int64_t(m.size());
    std::vector<uint64_t> total;
    switch (op) {
      case Coll::all_reduce:
        if (!combine(m, total, why)) return false;
        for (int64_t x : m) sum_[size_t(x)] = total;
        return true;
      case Coll::reduce:
        if (!combine(m, total, why)) return false;
        sum_[size_t(m[0])] = total;
        for (int64_t i = 1; i < k; ++i) sum_[size_t(m[size_t(i)])].assign(size_t(n_), 0);
        return true;
      case Coll::reduce_scatter: {
        const auto h = held(m[0]);
        if (!combine(m, total, why)) return false;
        if (int64_t(h.size()) % k) return fail(why, "chunks do not split evenly");
        const size_t piece = h.size() / size_t(k);
        for (int64_t i = 0; i < k; ++i) {
          auto& s = sum_[size_t(m[size_t(i)])];
          s.assign(size_t(n_), 0);
          for (size_t j = size_t(i) * piece; j < size_t(i + 1) * piece; ++j)
            s[size_t(h[j])] = total[size_t(h[j])];
        }
        return true;
      }
      case Coll::all_gather: {
        std::vector<uint64_t> g(size_t(n_), 0);
        int64_t last = -1;
        const size_t count = held(m[0]).size();
        for (int64_t x : m) {
          const auto h = held(x);
          if (h.size() != count) return fail(why, "members hold unequal pieces");
          for (int64_t c : h) {
            if (c <= last) return fail(why, "pieces gathered out of their order");
            last = c;
            g[size_t(c)] = sum_[size_t(x)][size_t(c)];
          }
        }
        for (int64_t x : m) sum_[size_t(x)] = g;
        return true;
      }
      case Coll::broadcast:
        for (int64_t i = 1; i < k; ++i) sum_[size_t(m[size_t(i)])] = sum_[size_t(m[0])];
        return true;
    }
    return false;
  }

  std::vector<int> fac_;
  std::vector<int64_t> size_;
  int64_t n_ = 1;
  std::vector<std::vector<uint64_t>> sum_;  // per rank, per chunk
};

}  // namespace

const char* coll_name(Coll c) {
  switch (c) {
    case Coll::all_reduce:
      return "all_reduce";
    case Coll::reduce_scatter:
      return "reduce_scatter";
    case Coll::all_gather:
      return "all_gather";
    case Coll::reduce:
      return "reduce";
    case Coll::broadcast:
      return "broadcast";
  }
  return "?";
}

std::vector<std::vector<Factor>> placements(const std::vector<int64_t>& axes, const Cluster& c,
                                            int64_t devices) {
  const std::vector<int64_t> w = level_widths(c, devices);
  int64_t total = 1;
  for (int64_t a : axes) total *= a;
  if (total != devices)
    throw Error(fmt::format("P2: a mesh of {} devices placed on {}", total, devices));
  std::vector<std::vector<Factor>> out;
  std::vector<int64_t> left = axes;
  std::vector<Factor> cur;
  // level l, axis a: the share of axis a on level l, the level's width still to fill
  std::function<void(size_t, size_t, int64_t)> walk = [&](size_t l, size_t a, int64_t room) {
    if (l == w.size()) {
      if (std::all_of(left.begin(), left.end(), [](int64_t x) { return x == 1; }))
        out.push_back(cur);
      return;
    }
    if (a == axes.size()) {
      if (room == 1) walk(l + 1, 0, l + 1 < w.size() ? w[l + 1] : 1);
      return;
    }
    for (int64_t s = 1; s <= room; ++s) {
      if (room % s || left[a] % s) continue;
      const int64_t stride = axes[a] / left[a];  // the shares of this axis on inner levels
      left[a] /= s;
      if (s > 1) cur.push_back({int(a), int(l), s, stride});
      walk(l, a + 1, room / s);
      if (s > 1) cur.pop_back();
      left[a] *= s;
    }
  };
  walk(0, 0, w.empty() ? 1 : w[0]);
  return out;
}

std::vector<Factor> axis_factors(const shard::Mesh& mesh, const Cluster& c,
                                 const std::string& axis) {
  const int64_t n = mesh.axis_size(axis), inner = mesh.stride(axis);
  std::vector<Factor> out;
  int64_t done = 1;  // the digits so far
  for (size_t l = 0; l < c.levels.size() && done < n; ++l) {
    const int64_t size = c.levels[l].size;
    // how much of the axis one group of this level holds
    int64_t hold = n;
    if (size > 0 && l + 1 < c.levels.size())
      hold = size % inner == 0 ? std::gcd(n, size / inner) : 1;
    if (hold <= done || hold % done) continue;
    out.push_back({mesh.index(axis), int(l), hold / done, done});
    done = hold;
  }
  if (done != n) out.push_back({mesh.index(axis), int(c.levels.size()) - 1, n / done, done});
  return out;
}

std::vector<Factor> reduction_factors(const shard::Mesh& mesh, const Cluster& c,
                                      const std::vector<std::string>& axes) {
  std::vector<Factor> f;
  for (const std::string& a : axes) {
    const std::vector<Factor> x = axis_factors(mesh, c, a);
    f.insert(f.end(), x.begin(), x.end());
  }
  return f;
}

bool splits_evenly(const Program& p, const std::vector<Factor>& f, int64_t numel) {
  int64_t pieces = 1;
  for (const Step& s : p.steps)
    if (s.op == Coll::reduce_scatter) {
      pieces *= group_size(f, s.group);
      if (numel % pieces) return false;
    }
  return true;
}

std::string group_spec(const shard::Mesh& mesh, const std::vector<Factor>& f, uint32_t group) {
  // the parts most significant first (outer axes, then an axis's higher digits), so the group's
  // ranks keep their order in the mesh and a ring over them crosses each level as few times as it
  // can; an axis whose every digit is in the group is named whole
  std::vector<size_t> in;
  for (size_t i = 0; i < f.size(); ++i)
    if (group >> i & 1) in.push_back(i);
  std::sort(in.begin(), in.end(), [&](size_t a, size_t b) {
    return f[a].axis != f[b].axis ? f[a].axis < f[b].axis : f[a].stride > f[b].stride;
  });
  std::string s;
  for (size_t k = 0; k < in.size();) {
    const Factor& x = f[in[k]];
    const std::string& axis = mesh.axes()[size_t(x.axis)].first;
    int64_t covered = 1;
    size_t end = k;
    while (end < in.size() && f[in[end]].axis == x.axis) covered *= f[in[end++]].size;
    s += s.empty() ? "" : "+";
    if (covered == mesh.axis_size(axis)) {
      s += axis;
    } else {
      for (size_t j = k; j < end; ++j)
        s += fmt::format("{}{}[{}:{}]", j == k ? "" : "+", axis, f[in[j]].stride, f[in[j]].size);
    }
    k = end;
  }
  return s;
}

std::string Program::text(const std::vector<Factor>& f,
                          const std::vector<std::string>& axes) const {
  std::string t;
  for (const Step& s : steps) {
    std::string g;
    for (size_t i = 0; i < f.size(); ++i)
      if (s.group >> i & 1)
        g += fmt::format("{}{}:{}@L{}", g.empty() ? "" : "+", axes[size_t(f[i].axis)], f[i].size,
                         f[i].level);
    t += fmt::format("{}{}({})", t.empty() ? "" : " ; ", coll_name(s.op), g);
  }
  return t;
}

// The largest number of reduced factors valid() can check: a reduction of more than
// kMaxSymbolicRanks ranks (Llama 70B's fsdp over 32 nodes and more) is checked on its shape, each
// reduced factor of size 2, and 2^6 ranks is what the symbolic run holds.
constexpr int kMaxCheckedFactors = std::bit_width(uint64_t(kMaxSymbolicRanks)) - 1;

bool valid(const Program& p, const std::vector<Factor>& f, uint32_t reduce, std::string* why) {
  for (const Step& s : p.steps)
    if (s.group & ~reduce) {
      if (why) *why = "a step over a factor the reduction does not sum";
      return false;
    }
  if (std::popcount(reduce) > kMaxCheckedFactors) {  // the flat all_reduce alone, unchecked
    if (p.steps.size() == 1 && p.steps[0].op == Coll::all_reduce && p.steps[0].group == reduce)
      return true;
    if (why)
      *why = fmt::format("a reduction over more than {} factors: only the flat all_reduce",
                         kMaxCheckedFactors);
    return false;
  }
  // Whether a program is valid depends on which factors each step spans and in what order, not on
  // the factors' sizes (p2_test checks it against sizes 2 to 4 on every program of a few steps):
  // more than 64 ranks, the run is on the same factors of size 2.
  std::vector<Factor> shape = f;
  if (group_size(f, reduce) > kMaxSymbolicRanks)
    for (size_t i = 0; i < shape.size(); ++i)
      if (reduce >> i & 1) shape[i].size = 2;
  Symbolic sym(shape, reduce);
  for (const Step& s : p.steps)
    if (!sym.apply(s, why)) return false;
  return sym.done(why);
}

double seconds(const Program& p, const std::vector<Factor>& f, double bytes, const Cluster& c) {
  double t = 0, held = bytes;
  for (const Step& s : p.steps) {
    const int64_t n = group_size(f, s.group);
    const int level = group_level(f, s.group);
    const Level& lv = c.levels[size_t(level)];
    const double load = group_load(f, s.group, c);
    switch (s.op) {
      case Coll::all_reduce:
        t += collective_seconds(ir::Op::all_reduce, held, n, c, level, load);
        break;
      case Coll::reduce_scatter:
        t += collective_seconds(ir::Op::reduce_scatter, held, n, c, level, load);
        held /= double(n);
        break;
      case Coll::all_gather:
        t += collective_seconds(ir::Op::all_gather, held, n, c, level, load);
        held *= double(n);
        break;
      case Coll::reduce:
      case Coll::broadcast:
        t += load * held / lv.bandwidth + double(n - 1) * lv.latency;
        break;
    }
  }
  return t;
}

double flat_seconds(const std::vector<Factor>& f, uint32_t reduce, double bytes, const Cluster& c) {
  return collective_seconds(ir::Op::all_reduce, bytes, group_size(f, reduce), c,
                            group_level(f, reduce), group_load(f, reduce, c));
}

namespace {

// The valid programs (their steps, in the order of enumeration) of every reduction synthesized so
// far, by its factors, reduced set, step limit and operations: validity depends on neither the
// bytes nor the cluster, and a plan search synthesizes the same reductions for candidate after
// candidate (the symbolic runs were a fifth of its time). Entries are never removed, so what is
// returned stays valid.
const std::vector<std::vector<Step>>& valid_programs(const std::vector<Factor>& f, uint32_t reduce,
                                                     int max_steps, bool rooted_ops) {
  static std::mutex mu;
  static std::map<std::string, std::vector<std::vector<Step>>> memo;
  std::string key = fmt::format("{} {} {}", reduce, max_steps, rooted_ops);
  for (const Factor& x : f) key += fmt::format(" {}/{}/{}/{}", x.axis, x.level, x.size, x.stride);
  {
    std::lock_guard<std::mutex> lock(mu);
    if (auto it = memo.find(key); it != memo.end()) return it->second;
  }
  std::vector<uint32_t> groups;  // every non-empty subset of the reduced factors
  for (uint32_t g = reduce; g; g = (g - 1) & reduce) groups.push_back(g);
  std::sort(groups.begin(), groups.end());
  std::vector<std::vector<Step>> out;
  Program cur;
  // the abstract state: factors summed, the stack of scatters, factors held by a root only
  std::vector<uint32_t> stack;
  std::function<void(uint32_t, uint32_t)> walk = [&](uint32_t summed, uint32_t rooted) {
    if (summed == reduce && stack.empty() && !rooted) {
      if (valid(cur, f, reduce)) out.push_back(cur.steps);
      return;
    }
    // each open scatter and root needs a step of its own to close
    const int need = int(stack.size()) + std::popcount(rooted) + (summed != reduce);
    if (int(cur.steps.size()) + std::max(need, 1) > max_steps) return;
    uint32_t scattered = 0;
    for (uint32_t s : stack) scattered |= s;
    for (uint32_t g : groups) {
      const bool fresh = !(g & (summed | scattered | rooted));
      for (Coll op : {Coll::all_reduce, Coll::reduce_scatter, Coll::reduce, Coll::all_gather,
                      Coll::broadcast}) {
        if (!rooted_ops && (op == Coll::reduce || op == Coll::broadcast)) continue;
        uint32_t ns = summed, nr = rooted;
        bool push = false, pop = false;
        switch (op) {
          case Coll::all_reduce:
            if (!fresh) continue;
            ns |= g;
            break;
          case Coll::reduce_scatter:
            if (!fresh) continue;
            ns |= g;
            push = true;
            break;
          case Coll::reduce:
            if (!fresh) continue;
            ns |= g;
            nr |= g;
            break;
          case Coll::all_gather:
            if (stack.empty() || stack.back() != g || (g & rooted)) continue;
            pop = true;
            break;
          case Coll::broadcast:
            if ((g & rooted) != g) continue;
            nr &= ~g;
            break;
        }
        cur.steps.push_back({op, g});
        if (push) stack.push_back(g);
        if (pop) stack.pop_back();
        walk(ns, nr);
        if (pop) stack.push_back(g);
        if (push) stack.pop_back();
        cur.steps.pop_back();
      }
    }
  };
  walk(0, 0);
  std::lock_guard<std::mutex> lock(mu);
  return memo.emplace(std::move(key), std::move(out)).first->second;
}

}  // namespace

std::vector<Program> synthesize(const std::vector<Factor>& f, uint32_t reduce, double bytes,
                                const Cluster& c, int max_steps, bool rooted_ops) {
  if (std::popcount(reduce) > kMaxCheckedFactors) {  // not checked: the flat all_reduce alone
    Program flat{{{Coll::all_reduce, reduce}}};
    flat.seconds = seconds(flat, f, bytes, c);
    return {flat};
  }
  std::vector<Program> out;
  for (const std::vector<Step>& steps : valid_programs(f, reduce, max_steps, rooted_ops)) {
    Program p{steps};
    p.seconds = seconds(p, f, bytes, c);
    out.push_back(std::move(p));
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const Program& a, const Program& b) { return a.seconds < b.seconds; });
  return out;
}

}  // namespace loom::sim::p2
