// DiPaCo's layout: blocks cut into contiguous levels with the embeddings first and the head last,
// paths as mixed-radix digits, every path a whole model whose tensors are the table's modules, and
// clear errors for layouts the model cannot hold.
#include "loom/dipaco/paths.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <set>

#include "loom/core/error.h"
#include "loom/core/shape.h"

namespace loom::dipaco {
namespace {

using train::Tensor;

// A Llama's tensors: an embedding, four layers of two tensors, the final norm and a head.
TensorList llama(int layers = 4) {
  TensorList t{{"model.embed_tokens.weight", {30, 10}, {}}};
  for (int l = 0; l < layers; ++l) {
    t.push_back({"model.layers." + std::to_string(l) + ".input_layernorm.weight", {10}, {}, l});
    t.push_back({"model.layers." + std::to_string(l) + ".mlp.up_proj.weight", {10, 10}, {}, l});
  }
  t.push_back({"model.norm.weight", {10}, {}});
  t.push_back({"lm_head.weight", {25, 10}, {}});
  return t;
}

TEST(Paths, LevelsAreContiguousRunsOfBlocksWithTheEmbeddingFirstAndTheHeadLast) {
  const TensorList m = llama();
  const Paths p = layout(m, {2, 3});
  ASSERT_EQ(p.count(), 6u);
  // embedding, layers 0-1 in level 0; layers 2-3, norm, head in level 1
  const std::vector<int64_t> want{0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1};
  EXPECT_EQ(p.level, want);
  // the table: level 0's 5 tensors twice, level 1's 6 tensors three times
  ASSERT_EQ(p.table.size(), 2 * 5 + 3 * 6u);
  EXPECT_EQ(p.table[0].name, "l0m0/model.embed_tokens.weight");
  EXPECT_EQ(p.table[5].name, "l0m1/model.embed_tokens.weight");
  EXPECT_EQ(p.table[10].name, "l1m0/model.layers.2.input_layernorm.weight");
  EXPECT_EQ(p.table.back().name, "l1m2/lm_head.weight");
}

TEST(Paths, APathIsItsDigitsModulesWholeAndInTheModelsOrder) {
  const TensorList m = llama();
  const Paths p = layout(m, {2, 3});
  EXPECT_EQ(p.digits(0), (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(p.digits(4), (std::vector<int64_t>{1, 1}));  // the last level varies fastest
  EXPECT_EQ(p.name(5), "1.2");
  std::set<size_t> used;
  for (size_t q = 0; q < p.count(); ++q) {
    ASSERT_EQ(p.path[q].size(), m.size());
    const std::vector<int64_t> d = p.digits(q);
    for (size_t i = 0; i < m.size(); ++i) {
      const Tensor& t = p.table[p.path[q][i]];
      EXPECT_EQ(t.name, fmt::format("l{}m{}/{}", p.level[i], d[size_t(p.level[i])], m[i].name));
      EXPECT_EQ(t.shape, m[i].shape);
      used.insert(p.path[q][i]);
    }
  }
  EXPECT_EQ(used.size(), p.table.size());  // every module is on some path
}

TEST(Paths, EveryPathStartsAsTheModelAndItsViewHasTheModelsNames) {
  TensorList m = llama();
  for (size_t i = 0; i < m.size(); ++i)
    m[i].data.assign(size_t(numel(m[i].shape)), float(i) + 0.5f);
  const Paths p = layout(m, {2, 2});
  TensorList table = module_table(p, m);
  table[p.path[3][0]].data[0] = -7;  // module (1, *) of level 0 only: paths 2 and 3
  for (size_t q = 0; q < p.count(); ++q) {
    const TensorList v = path_view(p, q, table, m);
    ASSERT_EQ(v.size(), m.size());
    for (size_t i = 0; i < m.size(); ++i) {
      EXPECT_EQ(v[i].name, m[i].name);
      EXPECT_EQ(v[i].data.size(), m[i].data.size());
    }
    EXPECT_EQ(v[0].data[0], q >= 2 ? -7.f : 0.5f) << "path " << q;
    EXPECT_EQ(v.back().data[0], m.back().data[0]);
  }
}

TEST(Paths, OneLevelOfOneModuleIsTheModel) {
  const TensorList m = llama(1);
  const Paths p = layout(m, {1});
  ASSERT_EQ(p.count(), 1u);
  ASSERT_EQ(p.table.size(), m.size());
  for (size_t i = 0; i < m.size(); ++i) EXPECT_EQ(p.path[0][i], i);
}

TEST(Paths, RefusesLayoutsTheModelCannotHold) {
  const TensorList m = llama(2);
  EXPECT_THROW(layout(m, {}), Error);
  EXPECT_THROW(layout(m, {2, 0}), Error);
  try {
    layout(m, {2, 2, 2});
    FAIL() << "three levels of two blocks";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("3 levels, but the model has 2 block(s)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(layout(llama(3), {64, 64, 2}), Error);  // 8192 paths
}

}  // namespace
}  // namespace loom::dipaco
