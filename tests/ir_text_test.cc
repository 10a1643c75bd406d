// IR-text tests of plans: for each tests/ir_text/*.ir, a small graph (the .ir.in it names), a plan,
// and the expected per-rank program, compared as printed text. Each file reads:
//
//   # graph: mlp_train.ir.in
//   # mesh: data=2
//   # tactics: fsdp:data data:data      (kind:axis, or shard:axis:pattern:dim)
//   # batch: x                          (inputs whose dim 0 is the batch)
//   graph mlp.rank { ... }              (the expected lowered program)
//
// LOOM_UPDATE_IR_TEXT=1 rewrites the expected text from the actual one; review the diff before
// committing it (that review is the test's oracle).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "loom/core/file.h"
#include "loom/ir/text.h"
#include "loom/shard/lower.h"

namespace loom::shard {
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
    if (c == sep) r.push_back(cur), cur.clear();
    else cur += c;
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
  ir::Graph g = ir::parse(read_file((kDir / header.at("graph")).string()), header.at("graph"));
  Plan plan;
  std::vector<std::pair<std::string, int64_t>> axes;
  for (const auto& a : split(header.at("mesh"), ',')) {
    auto kv = split(a, '=');
    axes.push_back({words(kv[0])[0], std::stoll(kv[1])});
  }
  plan.mesh = Mesh(axes);
  for (const auto& t : words(header.at("tactics"))) {
    auto f = split(t, ':');
    Tactic tac{f[0], f[1]};
    if (f.size() == 4) tac.pattern = f[2], tac.dim = std::stoll(f[3]);
    plan.tactics.push_back(tac);
  }
  GraphRoles roles;
  for (const auto& b : words(header["batch"])) roles.batch_inputs.push_back(g.find(b));
  Sharded s = shard_graph(g, plan, roles, plan.mesh.size());
  EXPECT_TRUE(s.propagation.converged) << "propagation reached no fixed point";
  const std::string actual = ir::print(s.program.graph);
  // the lowered program is plain IR: it parses back to the same text
  EXPECT_EQ(ir::print(ir::parse(actual, GetParam())), actual);
  if (std::getenv("LOOM_UPDATE_IR_TEXT")) {
    std::string head;
    for (const auto& key : {"graph", "mesh", "tactics", "batch"})
      if (header.count(key)) head += std::string("# ") + key + ": " + header[key] + "\n";
    write_file_atomic(file.string(), head + actual);
    return;
  }
  EXPECT_EQ(actual, expected) << GetParam() << ": the lowered program differs";
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
}  // namespace loom::shard
