// IR-text tests of passes: for each tests/ir_text/*.ir, a small graph (the .ir.in it names), the
// roles a model would declare, a plan, the passes to run, and the expected program, compared as
// printed text (Shardy's lit tests: input, pass, expected output). Each file reads:
//
//   # graph: mlp_train.ir.in
//   # mesh: data=2
//   # tactics: fsdp:data data:data      (kind:axis, or shard:axis:pattern:dim)
//   # batch: x                          (roles: inputs whose dim 0 is the batch)
//   # column: w1:0 w2:0                 (roles: column-parallel weights, value:dim)
//   # row: w3:1                         (roles: row-parallel weights, value:dim)
//   # experts: e.w1 e.w2                (roles: stacked expert weights, split by `expert`)
//   # blocks: l0=w1,w2 l1=w3,w4         (roles: parameter groups, in forward order; all layers
//                                        but those named embed and head)
//   # loss: loss                        (the model's loss value: recompute's forward/backward
//                                        boundary)
//   # passes: apply_tactics propagate lower   (default; passes/pipeline.h names them)
//   # schedule: max_in_flight=1 bucket=none   ([passes] options other than the defaults:
//                                        reshard_after_forward, recompute, bucket, bucket_mb,
//                                        prefetch, max_in_flight; cluster=F: clusters/F)
//   graph mlp.rank { ... }              (the expected program: the per-rank one once `lower` ran,
//                                        else the global graph)
//
// LOOM_UPDATE_IR_TEXT=1 rewrites the expected text from the actual one; review the diff before
// committing it (that review is the test's oracle).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "loom/core/file.h"
#include "loom/ir/text.h"
#include "loom/passes/pipeline.h"

namespace loom::passes {
namespace {

namespace fs = std::filesystem;
const fs::path kDir = fs::path(LOOM_SOURCE_DIR) / "tests" / "ir_text";

std::vector<std::string> words(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> w;
  for (std::string x; in >> x;) w.push_back(x);
  return w;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> r;
  std::string cur;
  for (char c : s) {
    if (c == sep)
      r.push_back(cur), cur.clear();
    else
      cur += c;
  }
  r.push_back(cur);
  return r;
}

class IrText : public ::testing::TestWithParam<std::string> {};

TEST_P(IrText, LoweredProgramMatches) {
  const fs::path file = kDir / GetParam();
  std::istringstream in(read_file(file.string()));
  std::map<std::string, std::string> header;
  std::string line, expected;
  while (std::getline(in, line)) {
    if (line.rfind("# ", 0) == 0 && expected.empty()) {
      auto colon = line.find(':');
      header[line.substr(2, colon - 2)] = colon == std::string::npos ? "" : line.substr(colon + 2);
    } else {
      expected += line + "\n";
    }
  }
  Compilation c;
  c.model.graph = ir::parse(read_file((kDir / header.at("graph")).string()), header.at("graph"));
  const ir::Graph& g = c.model.graph;
  auto value = [&](const std::string& name) {
    int v = g.find(name);
    if (v < 0)
      ADD_FAILURE() << GetParam() << ": the header names %" << name << ", not in the graph";
    return v;
  };
  Options opts;
  std::vector<std::pair<std::string, int64_t>> axes;
  for (const auto& a : split(header.at("mesh"), ',')) {
    auto kv = split(a, '=');
    axes.push_back({words(kv[0])[0], std::stoll(kv[1])});
  }
  opts.plan.mesh = shard::Mesh(axes);
  opts.ranks = opts.plan.mesh.size();
  for (const auto& t : words(header.at("tactics"))) {
    auto f = split(t, ':');
    shard::Tactic tac{f[0], f[1]};
    if (f.size() == 4) tac.pattern = f[2], tac.dim = std::stoll(f[3]);
    opts.plan.tactics.push_back(tac);
  }
  auto get = [&](const std::string& key) {
    auto it = header.find(key);
    return it == header.end() ? std::string() : it->second;
  };
  ir::Roles& roles = c.model.roles;
  for (const auto& b : words(get("batch"))) roles.batch_inputs.push_back(value(b));
  for (auto [key, list] :
       {std::pair{"column", &roles.column_parallel}, {"row", &roles.row_parallel}})
    for (const auto& w : words(get(key))) {
      auto f = split(w, ':');
      list->push_back({value(f[0]), std::stoll(f.at(1))});
    }
  for (const auto& e : words(get("experts"))) roles.experts.push_back(value(e));
  for (const auto& grp : words(get("blocks"))) {
    auto f = split(grp, '=');
    roles.blocks.push_back({f[0], {}});
    for (const auto& p : split(f.at(1), ',')) roles.blocks.back().params.push_back(value(p));
  }
  if (!get("loss").empty()) c.model.loss = value(get("loss"));
  for (const auto& kv : words(get("schedule"))) {
    auto f = split(kv, '=');
    ScheduleOptions& so = opts.schedule;
    if (f[0] == "bucket") {
      bool known = false;
      for (auto b : {ScheduleOptions::Bucket::none, ScheduleOptions::Bucket::block,
                     ScheduleOptions::Bucket::automatic})
        if (f.at(1) == bucket_name(b)) so.bucket = b, known = true;
      if (!known) ADD_FAILURE() << GetParam() << ": unknown bucket policy " << f.at(1);
    } else if (f[0] == "cluster") {
      so.cluster = std::make_shared<const sim::Cluster>(
          sim::load_cluster((fs::path(LOOM_SOURCE_DIR) / "clusters" / f.at(1)).string()));
    } else if (f[0] == "bucket_mb")
      so.bucket_mb = std::stod(f.at(1));
    else if (f[0] == "reshard_after_forward")
      so.reshard_after_forward = f.at(1) == "true";
    else if (f[0] == "recompute") {
      bool known = false;
      for (auto r : {ScheduleOptions::Recompute::none, ScheduleOptions::Recompute::selective,
                     ScheduleOptions::Recompute::selective_op, ScheduleOptions::Recompute::full})
        if (f.at(1) == recompute_name(r)) so.recompute = r, known = true;
      if (!known) ADD_FAILURE() << GetParam() << ": unknown recompute policy " << f.at(1);
    } else if (f[0] == "prefetch")
      so.prefetch = f.at(1) == "true";
    else if (f[0] == "max_in_flight")
      so.max_in_flight = std::stoll(f.at(1));
    else if (f[0] == "reduce_dtype")
      so.reduce_dtype = f.at(1) == "bf16" ? DType::bf16 : DType::f32;
    else
      ADD_FAILURE() << GetParam() << ": unknown schedule option " << f[0];
  }
  std::vector<std::string> passes = words(get("passes"));
  if (passes.empty()) passes = {"apply_tactics", "propagate", "lower"};
  run_passes(c, opts, passes);
  const bool lowered = std::find(passes.begin(), passes.end(), "lower") != passes.end();
  // a scheduled-stage pass runs on the per-rank program
  if (lowered) {
    EXPECT_TRUE(c.propagation.converged) << "propagation reached no fixed point";
  }
  const std::string actual = ir::print(lowered ? c.rank.graph : c.model.graph);
  // the program is plain IR: it parses back to the same text
  EXPECT_EQ(ir::print(ir::parse(actual, GetParam())), actual);
  if (std::getenv("LOOM_UPDATE_IR_TEXT")) {
    std::string head;
    for (const auto& key : {"graph", "mesh", "tactics", "batch", "column", "row", "experts",
                            "blocks", "loss", "passes", "schedule"})
      if (header.count(key)) head += std::string("# ") + key + ": " + header[key] + "\n";
    write_file_atomic(file.string(), head + actual);
    return;
  }
  EXPECT_EQ(actual, expected) << GetParam() << ": the program differs";
}

std::vector<std::string> cases() {
  std::vector<std::string> r;
  for (const auto& e : fs::directory_iterator(kDir))
    if (e.path().extension() == ".ir") r.push_back(e.path().filename().string());
  std::sort(r.begin(), r.end());
  return r;
}

INSTANTIATE_TEST_SUITE_P(Plans, IrText, ::testing::ValuesIn(cases()), [](const auto& info) {
  std::string n = info.param.substr(0, info.param.size() - 3);
  for (char& c : n)
    if (!isalnum(static_cast<unsigned char>(c))) c = '_';
  return n;
});

}  // namespace
}  // namespace loom::passes
