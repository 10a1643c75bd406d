// import_timed (calibrate.h): kernels another machine timed as a base cluster's profile.
#include <fmt/format.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "loom/calibrate/calibrate.h"
#include "loom/core/error.h"
#include "loom/core/file.h"
#include "loom/sim/cost.h"

namespace loom::calibrate {

sim::Profile import_profile(const std::string& path, double compute_speed, double memory_speed,
                            std::string* device, std::string* torch) {
  const nlohmann::json doc = read_json(path);
  if (!doc.is_object() || !doc.contains("kernels") || !doc["kernels"].is_array())
    throw Error(
        fmt::format("{}: expected an object with a \"kernels\" array "
                    "(bench/gpu/torch_kernels.py writes one)",
                    path));
  auto text = [&](const char* key, const char* fallback) {
    if (!doc.contains(key)) return std::string(fallback);
    if (!doc[key].is_string()) throw Error(fmt::format("{}: {}: expected a string", path, key));
    return doc[key].get<std::string>();
  };
  *device = text("device", "unknown device");
  *torch = text("torch", "unknown");
  sim::Profile prof;
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
      prof.ops[op].push_back({dt, num(k, "bytes"), num(k, "flops"), seconds});
    }
  }
  if (prof.matmul.empty() && prof.ops.empty()) throw Error(fmt::format("{}: no kernels", path));
  dedupe(prof);
  return prof;
}

Calibration import_timed(const ImportOptions& o) {
  if (!(o.compute_speed > 0) || !(o.memory_speed > 0))
    throw Error(fmt::format("calibrate: speed ratios must be > 0 (compute {}, memory {})",
                            o.compute_speed, o.memory_speed));
  Calibration r;
  r.cluster = sim::load_cluster(o.base);
  std::string device, torch;
  r.cluster.profile = import_profile(o.timed, o.compute_speed, o.memory_speed, &device, &torch);
  const bool derived = o.compute_speed != 1 || o.memory_speed != 1;
  r.cluster.name += derived ? "-derived" : "-measured";
  const std::string scaled = derived ? fmt::format(" --compute-speed {} --memory-speed {}",
                                                   o.compute_speed, o.memory_speed)
                                     : "";
  r.header = fmt::format(
      "# {} with the kernels timed on one {} by bench/gpu/torch_kernels.py (PyTorch {},\n"
      "# eager) as its [profile]{}: `loom calibrate --import {} --base {}{}`.\n"
      "# The rest is {}'s: its device, levels and efficiency model stand for what the "
      "profile\n# lacks. Units: SI.\n",
      o.base, device, torch,
      derived ? ", carried to this device by the speed ratios given (an estimate)" : "", o.timed,
      o.base, scaled, o.base);
  return r;
}

}  // namespace loom::calibrate
