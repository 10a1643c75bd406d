// Print -> parse -> print is the identity for every shipped model's forward and training graph, in
// f32 and bf16; and the parsed graph is structurally the same (ops, attrs, types, edges).
#include <gtest/gtest.h>

#include "loom/autodiff/autodiff.h"
#include "loom/core/error.h"
#include "loom/ir/text.h"
#include "loom/ops/verify.h"
#include "loom/passes/pipeline.h"
#include "loom/train/compile.h"
#include "loom/train/config.h"

namespace loom {
namespace {

struct RoundTripCase {
  std::string config, dtype, stage;
};

void PrintTo(const RoundTripCase& c, std::ostream* os) {
  *os << c.config << " " << c.dtype << " " << c.stage;
}

class IrRoundTrip : public ::testing::TestWithParam<RoundTripCase> {};

TEST_P(IrRoundTrip, PrintParsePrintIsIdentity) {
  const auto& c = GetParam();
  train::Config cfg = train::load_config(
      std::string(LOOM_SOURCE_DIR) + "/configs/" + c.config + ".toml", {"model.dtype=" + c.dtype});
  const auto m = passes::compile(train::step_options(cfg, passes::StepKind::train, 0),
                                 passes::parse_stage(c.stage))
                     .model;
  std::string text = ir::print(m.graph);
  ir::Graph parsed = ir::parse(text, c.config);
  EXPECT_EQ(ir::print(parsed), text);
  auto diags = ops::verify(parsed);
  EXPECT_TRUE(diags.empty()) << ::testing::PrintToString(diags);
  ASSERT_EQ(parsed.nodes().size(), m.graph.nodes().size());
  for (size_t i = 0; i < parsed.nodes().size(); ++i) {
    const auto &a = parsed.node(int(i)), &b = m.graph.node(int(i));
    ASSERT_EQ(a.op, b.op);
    ASSERT_EQ(a.attrs, b.attrs) << "node " << i << " " << a.op;
    ASSERT_EQ(a.inputs.size(), b.inputs.size());
    for (size_t k = 0; k < a.inputs.size(); ++k)
      ASSERT_EQ(parsed.value(a.inputs[k]).name, m.graph.value(b.inputs[k]).name);
  }
}

std::vector<RoundTripCase> cases() {
  std::vector<RoundTripCase> r;
  for (const char* cfg : {"tiny-llama", "tiny-gpt2", "bench-llama", "bench-gpt2"})
    for (const char* dt : {"f32", "bf16"})
      for (const char* st : {"forward", "train"}) r.push_back({cfg, dt, st});
  return r;
}

INSTANTIATE_TEST_SUITE_P(Models, IrRoundTrip, ::testing::ValuesIn(cases()), [](const auto& info) {
  std::string n = info.param.config + "_" + info.param.dtype + "_" + info.param.stage;
  for (char& ch : n)
    if (ch == '-') ch = '_';
  return n;
});

TEST(IrText, ParseErrorsNameTheLine) {
  EXPECT_THROW(ir::parse("graph g {\n  %x : f32[2] = add(%y, %y)\n}\n", "bad.ir"), loom::Error);
  try {
    ir::parse("graph g {\n  param %a : f33[2]\n}\n", "bad.ir");
    FAIL();
  } catch (const loom::Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.ir:2"), std::string::npos) << e.what();
  }
}

TEST(IrText, FloatsRoundTripExactly) {
  ir::Graph g("f");
  int a = g.add_input("a", {DType::f32, {2}}, ir::ValueKind::param);
  g.add_node(ir::Op::scale, {a}, {{"s", 0.1 + 0.2}}, {{DType::f32, {2}}}, {"b"});
  g.add_node(ir::Op::scale, {a},
             {{"s", 1e-300}, {"k", std::string("x")}, {"l", std::vector<int64_t>{-1, 2}}},
             {{DType::f32, {2}}}, {"c"});
  ir::Graph p = ir::parse(ir::print(g));
  EXPECT_EQ(std::get<double>(p.node(0).attrs.at("s")), 0.1 + 0.2);
  EXPECT_EQ(ir::print(p), ir::print(g));
}

}  // namespace
}  // namespace loom
