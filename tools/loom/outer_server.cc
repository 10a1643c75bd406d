// loom outer-server: the outer sync service for DiLoCo and asynchronous Local-SGD islands
// (src/loom/outer/server.h). It reads the same config as the islands: [model] for the parameters'
// names and shapes (and their initial values: [train] seed, or [model] init), [outer] for the mode,
// the outer optimizer, H, the lease and the token. SIGTERM or SIGINT stops it after writing its
// state.
#include <fmt/format.h>
#include <signal.h>

#include <filesystem>

#include "commands.h"
#include "loom/core/error.h"
#include "loom/core/file.h"
#include "loom/outer/island.h"
#include "loom/outer/model_tensors.h"
#include "loom/outer/server.h"
#include "loom/train/checkpoint.h"
#include "loom/train/config.h"
#include "loom/train/params.h"

namespace loom::cli {

namespace fs = std::filesystem;

std::function<int()> add_outer_server(CLI::App& app) {
  struct Opts {
    std::string config, listen = "127.0.0.1:7070", state_dir, port_file;
    std::vector<std::string> sets;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* s = app.add_subcommand(
      "outer-server", "serve the global parameters to DiLoCo / async Local-SGD islands");
  s->add_option("config", o->config, "config TOML (the islands' [model] and [outer])")->required();
  s->add_option("--listen", o->listen, "address to listen on (port 0: any free port)")
      ->capture_default_str();
  s->add_option("--state-dir", o->state_dir,
                "where the state is kept and resumed from (default runs/<config>-outer)");
  s->add_option("--port-file", o->port_file, "write the port listened on to this file");
  s->add_option("--set", o->sets, "override a config key: section.key=value");
  return [o]() {
    // SIGTERM/SIGINT are taken by sigwait below: block them before any thread starts
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

    train::Config cfg = train::load_config(o->config, o->sets);
    train::ParamStore params(cfg.model);
    params.init_random(uint64_t(cfg.train.seed));
    if (!cfg.init_weights.empty()) {
      params.load_init(cfg);
    }
    outer::TensorList initial = outer::model_tensors(params, true);
    outer::ServerConfig sc;
    sc.mode = cfg.outer.mode;
    sc.opt = {cfg.outer.lr, cfg.outer.momentum};
    sc.inner_steps = cfg.outer.inner_steps;
    sc.fragments = cfg.outer.fragments;
    sc.modules = cfg.outer.dipaco.modules;
    // quantised pushes: the updates islands pull are quantised the same way (DiPaCo's islands
    // pull their paths in f32)
    const outer::proto::Encoding enc = outer::encoding_of(cfg.outer.compress);
    sc.update_encoding = outer::quantized(enc) && sc.modules.empty() ? enc : outer::proto::F32;
    sc.delay = cfg.outer.delay;  // 0: the live islands
    const bool async = cfg.outer.mode == outer::OuterMode::async;
    sc.step_budget = async ? cfg.outer.islands * cfg.train.steps : 0;
    sc.lease_s = cfg.outer.lease_s;
    sc.min_islands = async ? 0 : cfg.outer.islands;
    sc.state_dir = o->state_dir.empty() ? "runs/" + fs::path(o->config).stem().string() + "-outer"
                                        : o->state_dir;
    sc.token = outer::read_token(cfg.outer, o->config);
    sc.tls_cert = cfg.outer.tls_cert;
    sc.tls_key = cfg.outer.tls_key;
    std::error_code ec;
    fs::create_directories(sc.state_dir, ec);
    if (ec)
      throw Error(fmt::format("--state-dir {}: cannot create ({})", sc.state_dir, ec.message()));
    // one server per state directory, locked before its state is read: two would overwrite each
    // other's global parameters
    const DirLock lock = DirLock::acquire(sc.state_dir, "--state-dir");

    outer::OuterServer server(sc, std::move(initial));
    int port = server.start(o->listen);
    if (!o->port_file.empty()) write_file_atomic(o->port_file, fmt::format("{}\n", port));
    int sig = 0;
    sigwait(&sigs, &sig);
    fmt::print(stderr, "outer-server: {}: stopping\n", strsignal(sig));
    server.shutdown();
    fmt::print(stderr, "outer-server: stopped at version {} ({} pushes); state in {}\n",
               server.version(), server.pushes(), outer::state_file(sc.state_dir));
    return 0;
  };
}

}  // namespace loom::cli
