// The loom CLI's subcommands: each file adds one to the app.
#pragma once

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>

namespace loom::cli {

// An integer flag's check: a whole number in [lo, hi], its bounds written as the config's are
// ("[1, 2^20]"; CLI11's PositiveNumber printed 1.8e308 in 300 digits), the value as given.
inline CLI::Validator whole_number(int64_t lo, int64_t hi) {
  auto bound = [](int64_t x) {  // 2^20, 2^63-1 (a double would round it to 2^63)
    for (int k = 16; x > 0 && k < 64; ++k) {
      const uint64_t p = uint64_t(1) << k;
      if (uint64_t(x) == p) return fmt::format("2^{}", k);
      if (uint64_t(x) == p - 1) return fmt::format("2^{}-1", k);
    }
    return fmt::format("{}", x);
  };
  const std::string range = fmt::format("[{}, {}]", bound(lo), bound(hi));
  return CLI::Validator(
      [lo, hi, range](std::string& in) -> std::string {
        int64_t v = 0;  // from_chars: past int64 is an error (strtoll would saturate)
        const auto [end, ec] = std::from_chars(in.data(), in.data() + in.size(), v);
        if (ec != std::errc() || end != in.data() + in.size() || v < lo || v > hi)
          return fmt::format("must be a whole number in {}, got {}", range, in);
        return "";
      },
      "INT in " + range);
}

// A floating-point flag's check: a finite number in [lo, hi] (CLI11's Range and NonNegativeNumber
// let "nan" through and print their bounds in full), and for a value the kernels use as f32
// (`f32`), one f32 holds: neither beyond its range nor rounded to 0.
inline CLI::Validator finite_number(double lo, double hi, bool f32 = false) {
  return CLI::Validator(
      [lo, hi, f32](std::string& in) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(in, v)) return "expected a number, got '" + in + "'";
        if (!std::isfinite(v) || v < lo || v > hi)
          return std::isinf(hi) ? fmt::format("must be a finite number >= {}, got {}", lo, in)
                                : fmt::format("must be a number in [{}, {}], got {}", lo, hi, in);
        if (f32 && (!std::isfinite(float(v)) || (v != 0 && float(v) == 0)))
          return fmt::format("is used as a 32-bit float, which cannot hold {}", in);
        return "";
      },
      std::isinf(hi) ? fmt::format("NUMBER >= {}", lo) : fmt::format("NUMBER in [{}, {}]", lo, hi));
}

// Each returns the action to run when its subcommand was chosen.
std::function<int()> add_step(CLI::App& app);
std::function<int()> add_bench(CLI::App& app);
std::function<int()> add_inspect(CLI::App& app);
std::function<int()> add_plan(CLI::App& app);       // plan.cc
std::function<int()> add_calibrate(CLI::App& app);  // calibrate.cc
std::function<int()> add_train(CLI::App& app);
std::function<int()> add_sample(CLI::App& app);        // sample.cc
std::function<int()> add_report(CLI::App& app);        // report.cc
std::function<int()> add_export(CLI::App& app);        // export.cc
std::function<int()> add_data(CLI::App& app);          // data.cc
std::function<int()> add_outer_server(CLI::App& app);  // outer_server.cc
std::function<int()> add_islands(CLI::App& app);       // islands.cc
std::function<int()> add_config(CLI::App& app);        // config.cc
std::function<int()> add_dipaco(CLI::App& app);        // dipaco.cc

}  // namespace loom::cli
