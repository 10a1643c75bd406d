// import_timed (calibrate.h): kernels another machine timed as a base cluster's profile.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "loom/calibrate/calibrate.h"
#include "loom/core/error.h"
#include "loom/core/file.h"
#include "loom/sim/cost.h"

namespace loom::calibrate {

TimedKernels read_timed(const std::string& path, double compute_speed, double memory_speed) {
  const nlohmann::json doc = read_json(path);
  if (!doc.is_object() || !doc.contains("kernels") || !doc["kernels"].is_array())
    throw Error(
        fmt::format("{}: expected an object with a \"kernels\" array "
                    "(bench/gpu/torch_kernels.py and loom bench --kernels-out write one)",
                    path));
  auto text = [&](const char* key, const char* fallback) {
    if (!doc.contains(key)) return std::string(fallback);
    if (!doc[key].is_string()) throw Error(fmt::format("{}: {}: expected a string", path, key));
    return doc[key].get<std::string>();
  };
  TimedKernels r;
  r.device = text("device", "unknown device");
  r.source = doc.contains("source") ? text("source", "")
                                    : fmt::format("bench/gpu/torch_kernels.py (PyTorch {}, eager)",
                                                  text("torch", "unknown"));
  if (doc.contains("runtime_bytes")) {
    const nlohmann::json& b = doc["runtime_bytes"];
    if (!b.is_number() || !std::isfinite(b.get<double>()) || b.get<double>() < 0)
      throw Error(fmt::format("{}: runtime_bytes: expected a number >= 0", path));
    r.runtime_bytes = b.get<double>();
  }
  sim::Profile& prof = r.profile;
  prof.threads = 1;
  const nlohmann::json& ks = doc["kernels"];
  for (size_t i = 0; i < ks.size(); ++i) {
    const nlohmann::json& k = ks[i];
    const std::string where = fmt::format("{}: kernels[{}]", path, i);
    auto num = [&](const nlohmann::json& o, const char* key) {
      if (!o.is_object() || !o.contains(key) || !o[key].is_number())
        throw Error(fmt::format("{}: {}: expected a number", where, key));
      const double v = o[key].get<double>();
      if (!std::isfinite(v) || v < 0)
        throw Error(fmt::format("{}: {} = {}: expected a finite number >= 0", where, key, v));
      return v;
    };
    if (!k.is_object() || !k.contains("op") || !k["op"].is_string() || !k.contains("dtype") ||
        !k["dtype"].is_string())
      throw Error(fmt::format("{}: expected op and dtype strings", where));
    DType dt;
    if (!parse_dtype(k["dtype"].get<std::string>(), &dt))
      throw Error(fmt::format("{}: dtype: unknown dtype {}", where, k["dtype"].dump()));
    ir::Op op{};
    try {
      op = ir::parse_op(k["op"].get<std::string>());
    } catch (const Error& e) {
      throw Error(fmt::format("{}: op: {}", where, e.what()));
    }
    const double seconds =
        num(k, "seconds") / (sim::compute_bound(op) ? compute_speed : memory_speed);
    if (!(seconds > 0)) throw Error(fmt::format("{}: seconds: expected > 0", where));
    if (k.contains("gemm")) {
      const nlohmann::json& g = k["gemm"];
      // a whole number in [lo, hi], checked before it becomes an integer
      auto whole = [&](const char* key, double lo, double hi) {
        const double v = num(g, key);
        if (v < lo || v > hi || v != std::floor(v))
          throw Error(fmt::format("{}: gemm.{} = {}: expected a whole number in {}..{}", where, key,
                                  v, lo, hi));
        return int64_t(v);
      };
      const double most = 1e12;
      prof.matmul.push_back({whole("ta", 0, 1), whole("tb", 0, 1), whole("m", 1, most),
                             whole("n", 1, most), whole("k", 1, most), whole("batch", 1, most), dt,
                             seconds});
    } else {
      prof.ops[op].push_back({dt, num(k, "bytes"), num(k, "flops"), seconds,
                              k.contains("scratch_bytes") ? num(k, "scratch_bytes") : 0.0});
    }
  }
  if (prof.matmul.empty() && prof.ops.empty()) throw Error(fmt::format("{}: no kernels", path));
  dedupe(prof);
  return r;
}

Calibration import_timed(const ImportOptions& o) {
  if (!(o.compute_speed > 0) || !(o.memory_speed > 0))
    throw Error(fmt::format("calibrate: speed ratios must be > 0 (compute {}, memory {})",
                            o.compute_speed, o.memory_speed));
  Calibration r;
  r.cluster = sim::load_cluster(o.base);
  if (o.timed.empty()) throw Error("calibrate: --import needs a timed-kernels file");
  std::string device, source;
  sim::Profile prof;
  double runtime = -1;
  for (const std::string& path : o.timed) {
    TimedKernels t = read_timed(path, o.compute_speed, o.memory_speed);
    if (path != o.timed.front() && t.device != device)
      throw Error(
          fmt::format("calibrate --import: {} was timed on {}, {} on {}: one cluster "
                      "file is one device's",
                      o.timed.front(), device, path, t.device));
    device = t.device;
    source += (source.empty() ? "" : "; ") + t.source;
    runtime = std::max(runtime, t.runtime_bytes);
    prof.matmul.insert(prof.matmul.end(), t.profile.matmul.begin(), t.profile.matmul.end());
    for (auto& [op, samples] : t.profile.ops)
      prof.ops[op].insert(prof.ops[op].end(), samples.begin(), samples.end());
  }
  dedupe(prof);
  r.cluster.profile = std::move(prof);
  // the runtime's own memory as measured there (a GPU's context and libraries' workspaces)
  if (runtime >= 0) r.cluster.device.runtime_bytes = runtime;
  for (std::string* s : {&device, &source})  // they go into a TOML comment: one line each
    for (char& ch : *s)
      if (ch == '\n' || ch == '\r') ch = ' ';
  const bool derived = o.compute_speed != 1 || o.memory_speed != 1;
  r.cluster.name += derived ? "-derived" : "-measured";
  const std::string scaled = derived ? fmt::format(" --compute-speed {} --memory-speed {}",
                                                   o.compute_speed, o.memory_speed)
                                     : "";
  r.header = fmt::format(
      "# {} with the kernels timed on one {} by\n# {} as its [profile]{}:\n"
      "# `loom calibrate --import {} --base {}{}`.\n"
      "# The rest is {}'s: its device, levels and efficiency model stand for what the "
      "profile\n# lacks. Units: SI.\n",
      o.base, device, source,
      derived ? ", carried to this device by the speed ratios given (an estimate)" : "",
      fmt::join(o.timed, " --import "), o.base, scaled, o.base);
  return r;
}

}  // namespace loom::calibrate
