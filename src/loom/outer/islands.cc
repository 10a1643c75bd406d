#include "loom/outer/islands.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "loom/core/clock.h"
#include "loom/core/error.h"
#include "loom/core/file.h"
#include "loom/data/text_corpus.h"
#include "loom/dipaco/paths.h"
#include "loom/dipaco/router.h"
#include "loom/outer/model_tensors.h"
#include "loom/outer/server.h"
#include "loom/train/checkpoint.h"
#include "loom/train/config.h"
#include "loom/train/evaluate.h"
#include "loom/train/loop.h"
#include "loom/train/params.h"
#include "loom/train/step.h"

extern char** environ;

namespace loom::outer {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

// Starts `args` with stdout and stderr appended to `log`; returns the pid.
pid_t spawn(const std::vector<std::string>& args, const std::string& log) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = 0;
  int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) throw_os("start", args[0], rc);
  return pid;
}

std::string tail(const std::string& path, size_t n = 1500) {
  std::ifstream in(path);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return s.size() > n ? "..." + s.substr(s.size() - n) : s;
}

std::string random_token() {
  std::ifstream in("/dev/urandom", std::ios::binary);
  unsigned char b[24];
  if (!in.read(reinterpret_cast<char*>(b), sizeof b)) throw Error("cannot read /dev/urandom");
  std::string t;
  for (unsigned char c : b) t += fmt::format("{:02x}", c);
  return t;
}

}  // namespace

std::map<int, std::string> parse_slowdowns(const std::vector<std::string>& specs, int islands) {
  std::map<int, std::string> slow;
  for (const auto& sl : specs) {
    size_t eq = sl.find('=');
    int i = -1;
    double f = 0;
    try {
      i = eq == std::string::npos ? -1 : std::stoi(sl.substr(0, eq));
      f = std::stod(sl.substr(eq + 1));
    } catch (const std::exception&) {
      i = -1;
    }
    if (i < 0 || i >= islands || !(f >= 1 && f <= 1000))
      throw Error(
          fmt::format("--slow {}: expected I=F with 0 <= I < {} and 1 <= F <= 1000", sl, islands));
    slow[i] = sl.substr(eq + 1);
  }
  return slow;
}

std::map<int, std::string> parse_stalls(const std::vector<std::string>& specs, int islands) {
  std::map<int, std::string> stalls;
  for (const auto& sp : specs) {
    const size_t eq = sp.find('=');
    int i = -1;
    try {
      size_t used = 0;
      if (eq != std::string::npos) i = std::stoi(sp.substr(0, eq), &used);
      if (used != eq) i = -1;
    } catch (const std::exception&) {
      i = -1;
    }
    if (i < 0 || i >= islands || stalls.count(i))
      throw Error(fmt::format(
          "--stall {}: expected I=STEP:SECONDS with 0 <= I < {}, one per island", sp, islands));
    const std::string rest = sp.substr(eq + 1);
    try {
      train::parse_stall(rest);
    } catch (const Error& e) {
      throw Error(fmt::format("--stall {}: {}", sp, e.what()));
    }
    stalls[i] = rest;
  }
  return stalls;
}

IslandsResult run_islands(const IslandsOptions& o) {
  if (o.islands < 1 || o.islands > 256)
    throw Error(fmt::format("--islands {}: expected 1..256", o.islands));
  LOOM_CHECK(!o.loom_binary.empty()) << "run_islands needs the loom executable";
  auto sets = o.sets;
  // [outer] islands is --islands here: a file or --set that says otherwise is refused, not
  // overridden without a word
  if (const int64_t said = train::load_config(o.config, sets).outer.islands;
      said != 0 && said != o.islands)
    throw Error(
        fmt::format("--islands {}: [outer] islands = {} ({} or --set)", o.islands, said, o.config),
        "loom islands sets [outer] islands to --islands: drop one of them, or make them "
        "agree");
  sets.push_back(fmt::format("outer.islands={}", o.islands));
  train::Config cfg = train::load_config(o.config, sets);  // fail here, not in N children
  const char* mode = outer_mode_name(cfg.outer.mode);
  if (cfg.data.path.empty())
    throw Error(fmt::format("{}: [data] path is not set", o.config),
                "point it at a text file, a directory of .txt files, or a loom data prepare "
                "directory");
  data::TextCorpus corpus = data::TextCorpus::open(cfg.data.path, cfg.train.seq_len);
  const int64_t P = cfg.outer.dipaco.paths();  // DiPaCo's paths; 0: not DiPaCo
  std::string router;                          // ... and its router directory, absolute
  if (P) {
    if (cfg.outer.dipaco.router.empty())
      throw Error(fmt::format("{}: DiPaCo islands need [outer] router", o.config),
                  "write one with loom dipaco route CONFIG --base RUN --out DIR");
    router = fs::absolute(cfg.outer.dipaco.router).string();
    const dipaco::Router r = dipaco::read_router(router);
    r.check_features(cfg.model.vocab_size, router);
    const int64_t routed = r.paths();
    if (routed != P)
      throw Error(
          fmt::format("router {} routes to {} paths, [outer] modules make {}", router, routed, P));
    for (int64_t p = 0; p < P; ++p)  // what island p trains on: here, not in its child
      if (!path_exists(fmt::format("{}/path_{}/meta.json", router, p)))
        throw Error(
            fmt::format("router {}: path_{}/ holds no prepared data (meta.json)", router, p),
            "write the router again with loom dipaco route");
    if (o.islands % P != 0)
      throw Error(
          fmt::format("--islands {}: DiPaCo needs a multiple of the {} paths (island i "
                      "trains path i mod {})",
                      o.islands, P, P));
    sets.push_back("outer.router=" + router);  // the islands run in their own directories
  }
  const std::string run =
      o.run_dir.empty() ? "runs/" + fs::path(o.config).stem().string() + "-islands" : o.run_dir;
  const std::string sdir = run + "/server";
  if (path_exists(outer::state_file(sdir)))
    throw Error(fmt::format("run dir {} already holds a run ({})", run, outer::state_file(sdir)),
                "choose another --run-dir, or remove it");
  std::error_code ec;
  fs::create_directories(sdir, ec);
  if (ec) throw Error(fmt::format("run dir {}: cannot create ({})", run, ec.message()));
  if (cfg.outer.token_file.empty() && !std::getenv("LOOM_OUTER_TOKEN"))
    ::setenv("LOOM_OUTER_TOKEN", random_token().c_str(), 1);
  if (!std::getenv("OMP_NUM_THREADS")) {
    unsigned hw = std::max(1u, std::thread::hardware_concurrency());
    ::setenv("OMP_NUM_THREADS", std::to_string(std::max(1u, hw / unsigned(o.islands))).c_str(), 1);
  }
  ::setenv("OMP_WAIT_POLICY", "passive", 0);
  const std::string& exe = o.loom_binary;
  auto with_sets = [&](std::vector<std::string> a) {
    for (const auto& x : sets) a.insert(a.end(), {"--set", x});
    return a;
  };
  auto t0 = Clock::now();
  const std::string port_file = sdir + "/port";
  fs::remove(port_file, ec);
  pid_t server = spawn(with_sets({exe, "outer-server", o.config, "--listen", "127.0.0.1:0",
                                  "--state-dir", sdir, "--port-file", port_file}),
                       sdir + "/log.txt");
  std::vector<pid_t> kids;
  auto stop_all = [&]() {
    for (pid_t p : kids) ::kill(p, SIGTERM);
    ::kill(server, SIGTERM);
    for (pid_t p : kids) ::waitpid(p, nullptr, 0);
    ::waitpid(server, nullptr, 0);
  };
  int port = 0;
  for (int i = 0; i < 600 && port == 0; ++i) {
    std::ifstream in(port_file);
    if (in >> port) break;
    int st;
    if (::waitpid(server, &st, WNOHANG) == server)
      throw Error(
          fmt::format("the outer server exited before listening:\n{}", tail(sdir + "/log.txt")));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (port == 0) {
    stop_all();
    throw Error(fmt::format("the outer server did not start within 60 s; see {}/log.txt", sdir));
  }
  if (o.progress)
    o.progress(fmt::format("outer server on 127.0.0.1:{}; starting {} islands ({} mode, H = {})",
                           port, o.islands, mode, cfg.outer.inner_steps));
  for (int i = 0; i < o.islands; ++i) {
    std::string dir = fmt::format("{}/island_{}", run, i);
    fs::create_directories(dir, ec);
    auto a = with_sets({exe, "train", o.config, "--run-dir", dir, "--set",
                        fmt::format("outer.server=127.0.0.1:{}", port)});
    if (P)
      a.insert(a.end(), {"--set", fmt::format("outer.path={}", i % P), "--set",
                         fmt::format("data.path={}/path_{}", router, i % P)});
    if (o.slowdown.count(i)) a.insert(a.end(), {"--slowdown", o.slowdown.at(i)});
    if (o.stalls.count(i)) a.insert(a.end(), {"--stall", o.stalls.at(i)});
    kids.push_back(spawn(a, dir + "/log.txt"));
  }
  // the islands as they end, in any order: the first that fails stops the others at once (they
  // would wait for its pushes until the first round's start barrier gave up on it)
  std::vector<std::string> failed;
  int st = 0, server_st = 0;
  bool server_done = false;
  for (int left = o.islands; left > 0;) {
    const pid_t p = ::waitpid(-1, &st, 0);
    if (p < 0 && errno == EINTR) continue;
    if (p < 0) break;  // no children left
    if (p == server) {
      server_done = true;
      server_st = st;
      if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) break;  // reported below; the islands stopped
      continue;
    }
    const auto it = std::find(kids.begin(), kids.end(), p);
    if (it == kids.end()) continue;
    const int i = int(it - kids.begin());
    *it = -1;
    --left;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      std::string log = fmt::format("{}/island_{}/log.txt", run, i);
      failed.push_back(fmt::format(
          "island {} ({}):\n{}", i,
          WIFSIGNALED(st) ? strsignal(WTERMSIG(st)) : fmt::format("exit {}", WEXITSTATUS(st)),
          tail(log)));
      break;
    }
  }
  for (pid_t p : kids)
    if (p > 0) ::kill(p, SIGTERM);
  for (pid_t p : kids)
    if (p > 0) ::waitpid(p, nullptr, 0);
  kids.clear();
  if (!server_done) {
    ::kill(server, SIGTERM);
    ::waitpid(server, &server_st, 0);
  }
  st = server_st;
  const double wall = seconds_since(t0);
  if (!failed.empty()) {
    std::string all;
    for (const auto& f : failed) all += f + "\n";
    throw Error(
        fmt::format("{}{} of {} islands failed; logs in {}", all, failed.size(), o.islands, run));
  }
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
    throw Error(fmt::format("the outer server failed:\n{}", tail(sdir + "/log.txt")));

  // the global parameters, evaluated as loom train evaluates
  uint64_t version = 0;
  outer::TensorList global = outer::read_state_params(outer::state_file(sdir), &version);
  train::ParamStore params(cfg.model);
  double val = 0;
  nlohmann::json per_path = nlohmann::json::array();
  int64_t table_parameters = 0;  // DiPaCo: the module table's, every module once
  if (!P) {
    for (const auto& t : global) {
      float* d = params.data(t.name);
      std::copy(t.data.begin(), t.data.end(), d);
    }
    train::StepRunner evaluator(cfg, params, train::StepRunner::Mode::eval);
    val = train::validation_loss(cfg, corpus, evaluator);
  } else {  // each path, on its own validation documents; written as RUN/path_<p>
    const outer::TensorList model = outer::model_tensors(params, false);
    const dipaco::Paths layout = dipaco::layout(model, cfg.outer.dipaco.modules);
    std::map<std::string, size_t> at;
    for (size_t k = 0; k < global.size(); ++k) at[global[k].name] = k;
    outer::TensorList table;
    for (const auto& t : layout.table) {
      auto it = at.find(t.name);
      if (it == at.end())
        throw Error(fmt::format("{}: no module tensor {}", outer::state_file(sdir), t.name));
      table_parameters += numel(t.shape);
      table.push_back(std::move(global[it->second]));
    }
    for (int64_t p = 0; p < P; ++p) {
      for (const auto& t : dipaco::path_view(layout, size_t(p), table, model))
        std::copy(t.data.begin(), t.data.end(), params.data(t.name));
      const std::string pdir = fmt::format("{}/path_{}", run, p);
      fs::create_directories(pdir, ec);
      params.save(pdir + "/model.safetensors");
      fs::copy_file(fmt::format("{}/island_{}/config.toml", run, p), pdir + "/config.toml",
                    fs::copy_options::overwrite_existing);
      train::Config pc = train::load_run_config(pdir);
      data::TextCorpus pdata = data::TextCorpus::open(pc.data.path, pc.train.seq_len);
      train::StepRunner evaluator(pc, params, train::StepRunner::Mode::eval);
      const double v = train::validation_loss(pc, pdata, evaluator);
      per_path.push_back({{"path", p}, {"name", layout.name(size_t(p))}, {"val_loss", v}});
      val += v / double(P);
    }
  }
  nlohmann::json islands = nlohmann::json::array();
  uint64_t sent = 0, received = 0, peak = 0;
  std::vector<double> wait_shares;  // each island's share of its wall time waiting for the server
  for (int i = 0; i < o.islands; ++i) {
    std::ifstream in(fmt::format("{}/island_{}/metrics.jsonl", run, i));
    nlohmann::json lastm, last_outer;
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded()) continue;
      lastm = j;
      if (j.contains("outer_round")) last_outer = j;
    }
    nlohmann::json isl{{"island", i}, {"steps", lastm.value("step", 0)}};
    if (!last_outer.is_null()) {
      for (const char* k : {"outer_round", "bytes_sent", "bytes_received", "peak_round_bytes",
                            "wait_s", "wait_share_total"})
        isl[k] = last_outer[k];
      wait_shares.push_back(last_outer.value("wait_share_total", 0.0));
      peak = std::max(peak, last_outer.value("peak_round_bytes", uint64_t(0)));
      sent += last_outer.value("bytes_sent", uint64_t(0));
      received += last_outer.value("bytes_received", uint64_t(0));
    }
    islands.push_back(isl);
  }
  nlohmann::json summary{
      {"islands", o.islands},
      {"mode", mode},
      {"inner_steps", cfg.outer.inner_steps},
      {"compress", cfg.outer.compress},
      {"fragments", cfg.outer.fragments},
      {"overlap", cfg.outer.overlap},
      {"mix", cfg.outer.mix},
      {"version", version},
      {"parameters", params.total_elements()},
      {"val_loss", val},
      {"bytes_sent", sent},
      {"bytes_received", received},
      {"peak_round_bytes", peak},
      {"wall_s", wall},
      {"wait_share_max",
       wait_shares.empty() ? 0.0 : *std::max_element(wait_shares.begin(), wait_shares.end())},
      {"per_island", islands}};
  if (P) {
    summary["modules"] = cfg.outer.dipaco.modules;
    summary["router"] = router;
    summary["per_path"] = per_path;
    summary["table_parameters"] = table_parameters;
  }
  write_file_atomic(run + "/summary.json", summary.dump(2) + "\n");
  return {run, summary};
}

}  // namespace loom::outer
