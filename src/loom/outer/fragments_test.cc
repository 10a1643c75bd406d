// Streaming DiLoCo's fragments: blocks strided by layer, the rest balancing the sizes, one fragment
// the whole model, and a clear error when the model cannot fill the fragments asked for.
#include "loom/outer/fragments.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "loom/core/error.h"
#include "loom/outer/model_tensors.h"
#include "loom/train/config.h"

namespace loom::outer {
namespace {

// A Llama's tensors (names as loom's models write them), four layers of 100 + 10 elements, an
// embedding of 300 and a head of 250.
TensorList llama() {
  TensorList t{{"model.embed_tokens.weight", {30, 10}, {}}};
  for (int l = 0; l < 4; ++l) {
    t.push_back({"model.layers." + std::to_string(l) + ".input_layernorm.weight", {10}, {}, l});
    t.push_back({"model.layers." + std::to_string(l) + ".mlp.up_proj.weight", {10, 10}, {}, l});
  }
  t.push_back({"model.norm.weight", {10}, {}});
  t.push_back({"lm_head.weight", {25, 10}, {}});
  return t;
}

int64_t elements(const TensorList& spec, const std::vector<size_t>& which) {
  int64_t n = 0;
  for (size_t i : which) n += numel(spec[i].shape);
  return n;
}

TEST(Fragments, OneFragmentIsTheWholeModelInOrder) {
  const TensorList s = llama();
  const Fragments f = split_fragments(s, 1);
  ASSERT_EQ(f.size(), 1u);
  ASSERT_EQ(f[0].size(), s.size());
  for (size_t i = 0; i < s.size(); ++i) EXPECT_EQ(f[0][i], i);
}

TEST(Fragments, LayersGoRoundRobinAndTheRestToTheLightestFragment) {
  const TensorList s = llama();
  const Fragments f = split_fragments(s, 2);
  ASSERT_EQ(f.size(), 2u);
  // layers 0 and 2 in fragment 0, 1 and 3 in fragment 1 (strided), 220 elements each; then the
  // embedding (300) to fragment 0, the head (250) to fragment 1, the norm (10) to fragment 1
  const std::vector<size_t> want0 = {0, 1, 2, 5, 6}, want1 = {3, 4, 7, 8, 9, 10};
  EXPECT_EQ(f[0], want0);
  EXPECT_EQ(f[1], want1);
  EXPECT_EQ(elements(s, f[0]), 520);
  EXPECT_EQ(elements(s, f[1]), 480);
  // every tensor in exactly one fragment
  std::vector<int> seen(s.size());
  for (const auto& p : split_fragments(s, 4))
    for (size_t i : p) ++seen[i];
  for (size_t i = 0; i < s.size(); ++i) EXPECT_EQ(seen[i], 1) << s[i].name;
}

TEST(Fragments, MoreFragmentsThanLayersIsAnError) {
  try {
    split_fragments(llama(), 5);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[outer] fragments = 5: the model has 4 layer(s)"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(split_fragments(llama(), 0), Error);
}

TEST(Fragments, GatherAndScatterAreInverse) {
  TensorList all = llama();
  for (size_t i = 0; i < all.size(); ++i) all[i].data.assign(size_t(numel(all[i].shape)), float(i));
  const std::vector<size_t> which = {1, 4, 10};
  TensorList part = gather(all, which);
  ASSERT_EQ(part.size(), 3u);
  EXPECT_EQ(part[1].name, all[4].name);
  for (auto& t : part)
    for (float& x : t.data) x += 100;
  scatter(part, which, all);
  EXPECT_EQ(all[4].data[0], 104.f);
  EXPECT_EQ(all[3].data[0], 3.f);
}

// A model's tensors take their layers from the parameter groups it declares: the blocks in forward
// order, -1 for the embeddings, the final norm and the head.
TEST(ModelTensors, LayersComeFromTheDeclaredBlocks) {
  for (const char* arch : {"llama", "gpt2"}) {
    const models::ModelConfig m =
        train::load_config(fmt::format("{}/configs/tiny-{}.toml", LOOM_SOURCE_DIR, arch),
                           {"model.n_layers=3"})
            .model;
    train::ParamStore p(m);
    const TensorList t = model_tensors(p, false);
    ASSERT_EQ(t.size(), p.infos().size());
    std::vector<int> per_layer(3, 0);
    for (size_t i = 0; i < t.size(); ++i) {
      const std::string& block = p.infos()[i].block;
      if (block == "embed" || block == "head") {
        EXPECT_EQ(t[i].layer, -1) << t[i].name;
      } else {
        ASSERT_GE(t[i].layer, 0) << t[i].name;
        ASSERT_LT(t[i].layer, 3) << t[i].name;
        EXPECT_EQ(block, "layers." + std::to_string(t[i].layer)) << t[i].name;
        ++per_layer[size_t(t[i].layer)];
      }
      EXPECT_TRUE(t[i].data.empty());
    }
    EXPECT_EQ(per_layer[0], per_layer[2]) << arch;  // every layer alike
    EXPECT_GT(per_layer[0], 0) << arch;
  }
}

}  // namespace
}  // namespace loom::outer
