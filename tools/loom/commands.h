// The loom CLI's subcommands: each file adds one to the app.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

namespace loom::cli {

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
