#include "loom/ops/verify.h"

#include <gtest/gtest.h>

#include "loom/core/error.h"
#include "loom/ir/text.h"

namespace loom::ops {
namespace {

bool mentions(const std::vector<std::string>& d, const std::string& s) {
  for (const auto& x : d)
    if (x.find(s) != std::string::npos) return true;
  return false;
}

ir::Graph well_typed() {
  return ir::parse(R"(graph ok {
  param %w : f32[4,8]
  input %x : f32[2,3,8]
  %y : f32[2,3,4] = matmul(%x, %w) {ta = 0, tb = 1}
  output %y
})");
}

TEST(Verify, AcceptsAWellTypedGraph) {
  auto g = well_typed();
  EXPECT_TRUE(verify(g).empty());
}

// The verdict is kept per graph version: a copy of a valid graph is valid without a second look,
// and a change to the copy (a new version) is looked at again.
TEST(Verify, AChangedCopyOfAValidGraphIsVerifiedAgain) {
  auto g = well_typed();
  ASSERT_TRUE(verify(g).empty());
  ir::Graph h = g;
  EXPECT_EQ(h.version(), g.version());
  EXPECT_TRUE(verify(h).empty());
  const int x = h.find("x"), w = h.find("w");
  h.add_node(ir::Op::matmul, {x, w}, {{"ta", int64_t(0)}, {"tb", int64_t(1)}},
             {{DType::f32, {2, 3, 5}}}, {"z"});
  EXPECT_NE(h.version(), g.version());
  EXPECT_TRUE(mentions(verify(h), "%z is f32[2,3,5], the op infers f32[2,3,4]"));
  EXPECT_TRUE(verify(g).empty());
  h.mutable_value(h.find("z")).type = {DType::f32, {2, 3, 4}};
  EXPECT_TRUE(verify(h).empty());
}

TEST(Verify, NamesTheValueWithAWrongType) {
  auto g = ir::parse(R"(graph bad {
  param %w : f32[4,8]
  input %x : f32[2,3,8]
  %y : f32[2,3,5] = matmul(%x, %w) {ta = 0, tb = 1}
})");
  auto d = verify(g);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_TRUE(mentions(d, "%y is f32[2,3,5], the op infers f32[2,3,4]")) << d[0];
}

TEST(Verify, ReportsShapeErrors) {
  auto g = ir::parse(R"(graph bad {
  input %a : f32[3]
  input %b : f32[4]
  %c : f32[3] = mul(%a, %b)
})");
  auto d = verify(g);
  EXPECT_TRUE(mentions(d, "node #0 mul")) << ::testing::PrintToString(d);
}

// A node holds an ir::Op, so an unknown op cannot reach the verifier: the parser refuses it, naming
// the word, the line and the nearest op.
TEST(Verify, UnknownOpsAreRefusedWhenParsed) {
  try {
    ir::parse(R"(graph bad {
  input %a : f32[3]
  %c : f32[3] = mul(%a, %a)
  %d : f32[3] = scael(%a)
})",
              "bad.ir");
    FAIL() << "parsed an unknown op";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("bad.ir:4: IR parse error: unknown op 'scael'"), std::string::npos) << m;
    EXPECT_NE(m.find("did you mean 'scale'?"), std::string::npos) << m;
  }
}

TEST(Verify, CatchesReadAfterInPlaceUpdate) {
  auto g = ir::parse(R"(graph bad {
  param %p : f32[4]
  input %g : f32[4]
  state %m : f32[4]
  state %v : f32[4]
  input %h : f32[3]
  input %s : f32[]
  %p1 : f32[4], %m1 : f32[4], %v1 : f32[4] = adamw(%p, %g, %m, %v, %h, %s) {beta1 = 0.9, beta2 = 0.95, eps = 1e-08, wd = 0.0}
  %late : f32[4] = scale(%p) {s = 2.0}
})");
  EXPECT_TRUE(mentions(verify(g), "overwrites %p in place")) << ::testing::PrintToString(verify(g));
}

// An asynchronous collective's output is in flight until its wait; its input stays unwritten.
TEST(Verify, AcceptsAStartAndItsWait) {
  auto g = ir::parse(R"(graph ok {
  param %w : f32[2,4]
  %w.inflight : f32[4,4] = all_gather(%w) {async = 1, axis = "data", dim = 0, n = 2}
  %y : f32[2,4] = scale(%w) {s = 2.0}
  %w.all : f32[4,4] = wait(%w.inflight, %w)
  %z : f32[4,4] = scale(%w.all) {s = 2.0}
  output %z
})");
  EXPECT_TRUE(verify(g).empty()) << ::testing::PrintToString(verify(g));
}

TEST(Verify, CatchesAReadOfAValueInFlight) {
  auto g = ir::parse(R"(graph bad {
  param %w : f32[2,4]
  %w.inflight : f32[4,4] = all_gather(%w) {async = 1, axis = "data", dim = 0, n = 2}
  %early : f32[4,4] = scale(%w.inflight) {s = 2.0}
  %w.all : f32[4,4] = wait(%w.inflight, %w)
})");
  EXPECT_TRUE(mentions(verify(g), "reads %w.inflight while its collective is in flight"))
      << ::testing::PrintToString(verify(g));
}

TEST(Verify, CatchesAWaitWithoutItsStart) {
  auto g = ir::parse(R"(graph bad {
  param %w : f32[2,4]
  param %u : f32[2,4]
  %w.all : f32[4,4] = all_gather(%w) {axis = "data", dim = 0, n = 2}
  %x : f32[4,4] = wait(%w.all, %w)
  %u.inflight : f32[4,4] = all_gather(%u) {async = 1, axis = "data", dim = 0, n = 2}
  %y : f32[4,4] = wait(%u.inflight, %w)
})");
  const auto d = verify(g);
  EXPECT_TRUE(mentions(d, "%w.all is not the output of an asynchronous collective of %w"))
      << ::testing::PrintToString(d);
  EXPECT_TRUE(mentions(d, "%u.inflight is not the output of an asynchronous collective of %w"))
      << ::testing::PrintToString(d);
}

TEST(Verify, CatchesAnInPlaceWriteOfAnInputInFlight) {
  auto g = ir::parse(R"(graph bad {
  param %p : f32[4]
  input %g : f32[4]
  state %m : f32[4]
  state %v : f32[4]
  input %h : f32[3]
  input %s : f32[]
  %p.inflight : f32[8] = all_gather(%p) {async = 1, axis = "data", dim = 0, n = 2}
  %p1 : f32[4], %m1 : f32[4], %v1 : f32[4] = adamw(%p, %g, %m, %v, %h, %s) {beta1 = 0.9, beta2 = 0.95, eps = 1e-08, wd = 0.0}
  %p.all : f32[8] = wait(%p.inflight, %p)
})");
  EXPECT_TRUE(mentions(verify(g), "overwrites %p in place")) << ::testing::PrintToString(verify(g));
}

}  // namespace
}  // namespace loom::ops
