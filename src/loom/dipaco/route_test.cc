// DiPaCo's routing and evaluation called directly: route() splits the documents into balanced
// paths and writes a whole router; evaluate() of paths that are one model scores every path alike.
#include "loom/dipaco/route.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "loom/core/error.h"
#include "loom/dipaco/router.h"
#include "loom/train/config.h"

namespace loom::dipaco {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("loom_route_test_" + std::to_string(::getpid()));
  TempDir() { fs::create_directories(path / "data"); }
  ~TempDir() { fs::remove_all(path); }
};

const std::string kConfig = std::string(LOOM_SOURCE_DIR) + "/configs/tiny-llama.toml";

// Two kinds of text in three books (the last one the validation split).
std::string write_books(const fs::path& dir) {
  std::mt19937 rng(5);
  const char* kinds[2][4] = {{"alpha", "beta", "gamma", "delta"}, {"1", "22", "333", "4444"}};
  for (int b = 0; b < 3; ++b) {
    std::ofstream out(dir / ("book" + std::to_string(b) + ".txt"));
    for (int i = 0; i < 4000; ++i) out << kinds[(i / 200) % 2][rng() % 4] << ' ';
  }
  return dir.string();
}

void load(const std::string& path, train::ParamStore& p) { p.load(path); }

TEST(Route, DocumentsGoToBalancedPathsAndTheRouterIsWhole) {
  TempDir d;
  const std::string data = write_books(d.path / "data");
  const std::string base = (d.path / "base.safetensors").string();
  {
    train::ParamStore p(train::load_config(kConfig).model);
    p.init_random(1);
    p.save(base);
  }
  RouteOptions o;
  o.config = kConfig;
  o.sets = {"outer.modules=[1,2]", "data.path=" + data};
  o.base = base;
  o.out = (d.path / "router").string();
  o.doc_tokens = 256;
  o.prefix = 16;
  o.holdout_every = 5;
  o.load_weights = load;
  const RouteResult r = route(o);
  ASSERT_EQ(r.paths.size(), 2u);
  int64_t docs = 0;
  for (const auto& p : r.paths) {
    docs += p["train_docs"].get<int64_t>();
    EXPECT_LE(p["train_docs"].get<int64_t>(), (r.train_docs + 1) / 2);  // balanced: ceil(n/2)
    EXPECT_TRUE(fs::exists(fmt::format("{}/path_{}/train.bin", o.out, p["path"].get<int>())));
  }
  EXPECT_EQ(docs, r.train_docs);
  EXPECT_GT(r.held_out, 0);
  EXPECT_EQ(read_router(o.out).paths(), 2);
  EXPECT_TRUE(fs::exists(o.out + "/all/train.bin"));
  EXPECT_THROW(route(o), Error);  // a router already there

  // paths that are all the base model: every path scores each document alike
  const fs::path run = d.path / "run";
  for (int p = 0; p < 2; ++p) {
    const fs::path dir = run / ("path_" + std::to_string(p));
    fs::create_directories(dir);
    fs::copy_file(base, dir / "model.safetensors");
    train::Config pc = train::load_config(
        kConfig, {"outer.modules=[1,2]", "outer.router=\"" + o.out + "\"", "data.path=" + data});
    std::ofstream(dir / "config.toml") << pc.text;
  }
  const nlohmann::json e = evaluate({run.string(), base, load});
  ASSERT_TRUE(e.contains("heldout"));
  const nlohmann::json& h = e["heldout"];
  EXPECT_GT(h["docs"].get<int64_t>(), 0);
  EXPECT_DOUBLE_EQ(h["routed_loss"].get<double>(), h["mean_path_loss"].get<double>());
  EXPECT_DOUBLE_EQ(h["routed_loss"].get<double>(), h["best_path_loss"].get<double>());
  EXPECT_DOUBLE_EQ(h["routed_loss"].get<double>(), h["dense_loss"].get<double>());
  EXPECT_EQ(h["routed_beats_mean_path"].get<double>(), 0.0);  // never strictly below itself
}

TEST(Route, ConfigsWithoutPathsAreRefused) {
  RouteOptions o;
  o.config = kConfig;
  o.out = "/nonexistent/router";
  o.load_weights = load;
  try {
    route(o);
    FAIL() << "routed without [outer] modules";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[outer] modules is not set"), std::string::npos);
  }
  EXPECT_THROW(evaluate({"/nonexistent/run", "", load}), Error);
}

}  // namespace
}  // namespace loom::dipaco
