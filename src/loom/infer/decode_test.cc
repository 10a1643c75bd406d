// Incremental decoding against the full forward: for Llama (grouped-query, own and tied head),
// GPT-2 (learned positions), bf16, and dropless MoE with NormFormer, the logits after feeding
// tokens 0..k through the key/value cache equal the full forward's at position k, for every k,
// whether the tokens came one at a time or in chunks; a reset cache decodes the same again; tokens
// past the cache and ids outside the vocabulary are errors that say so.
#include "loom/infer/decode.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>

#include "loom/core/error.h"
#include "loom/runtime/executor.h"

namespace loom::infer {
namespace {

constexpr int64_t kT = 24;  // tokens, and the cache length

models::ModelConfig tiny(const std::string& arch, DType dtype = DType::f32, bool tied = false) {
  models::ModelConfig m;
  m.arch = arch;
  m.vocab_size = 61;
  m.d_model = 32;
  m.n_layers = 2;
  m.n_heads = 4;
  m.n_kv_heads = arch == "llama" ? 2 : 0;
  m.max_seq_len = 32;
  m.tie_embeddings = tied;
  m.dtype = dtype;
  return m;
}

// tiny() with dropless MoE layers (4 experts, top 2) and NormFormer
models::ModelConfig tiny_moe_normformer(const std::string& arch, DType dtype = DType::f32) {
  models::ModelConfig m = tiny(arch, dtype);
  m.moe.experts = 4;
  m.moe.top_k = 2;
  m.moe.dropless = true;
  m.normformer = true;
  return m;
}

std::vector<int32_t> tokens(const models::ModelConfig& m) {
  std::mt19937 gen(3);
  std::vector<int32_t> t(size_t(kT + 1));
  for (auto& x : t) x = int32_t(gen() % uint32_t(m.vocab_size));
  return t;
}

// The full forward's logits (kT, V) over the first kT tokens.
std::vector<float> full_logits(const models::ModelConfig& m, train::ParamStore& p,
                               const std::vector<int32_t>& toks) {
  passes::Options o;
  o.model = m;
  o.seq_len = kT;
  o.kind = passes::StepKind::infer;
  passes::Compilation c = passes::compile(o, passes::Stage::forward);
  const ir::Graph& g = c.model.graph;
  runtime::Executor ex(g);
  for (const auto& i : p.infos()) ex.bind(g.find(i.name), p.data(i.name));
  std::vector<int32_t> in(toks.begin(), toks.begin() + kT), tg(toks.begin() + 1, toks.end());
  ex.bind(c.model.tokens, in.data());
  ex.bind(c.model.targets, tg.data());
  ex.run();
  const float* l = ex.ptr<float>(c.model.logits);
  return {l, l + kT * m.vocab_size};
}

// max |a - b| over a row, relative to 1 + the row's largest |logit|
double row_error(const float* a, const float* b, int64_t V) {
  double err = 0, scale = 1;
  for (int64_t v = 0; v < V; ++v) {
    err = std::max(err, std::abs(double(a[v]) - double(b[v])));
    scale = std::max(scale, 1 + std::abs(double(b[v])));
  }
  return err / scale;
}

// Random weights of a size that makes attention sharp (init_random's 0.02 leaves it so flat that a
// token at the wrong position would hardly change a logit).
void init_sharp(train::ParamStore& p) {
  p.init_random(11);
  for (const auto& i : p.infos())
    if (i.shape.size() == 2)
      for (int64_t k = 0; k < numel(i.shape); ++k) p.data(i.name)[k] *= 12;
}

void expect_decode_matches(const models::ModelConfig& m, double tol) {
  train::ParamStore p(m);
  init_sharp(p);
  const auto toks = tokens(m);
  const auto full = full_logits(m, p, toks);
  const int64_t V = m.vocab_size;
  DecodeRunner d(m, p, kT, "<test>");
  // a 5-token prompt (chunks 4 + 1), then one token at a time
  const float* l = d.feed(toks.data(), 5);
  EXPECT_LE(row_error(l, &full[4 * V], V), tol) << "after the prompt";
  for (int64_t k = 5; k < kT; ++k) {
    l = d.feed(&toks[size_t(k)], 1);
    EXPECT_LE(row_error(l, &full[size_t(k * V)], V), tol) << "position " << k;
  }
  EXPECT_EQ(d.position(), kT);
  // the cache is full: one more token is an error naming it
  try {
    d.feed(&toks[kT], 1);
    ADD_FAILURE() << "a token past the cache was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("do not fit the key/value cache of 24"), std::string::npos)
        << e.what();
  }
  // reset, then the same tokens in other chunks: 7 (4+2+1), 16, 1
  d.reset();
  l = d.feed(toks.data(), 7);
  EXPECT_LE(row_error(l, &full[6 * V], V), tol) << "7 tokens at once";
  l = d.feed(&toks[7], 16);
  EXPECT_LE(row_error(l, &full[22 * V], V), tol) << "16 tokens at position 7";
  l = d.feed(&toks[23], 1);
  EXPECT_LE(row_error(l, &full[23 * V], V), tol) << "the last position";
}

TEST(Decode, LlamaGroupedQueryMatchesFullForward) { expect_decode_matches(tiny("llama"), 1e-5); }
TEST(Decode, LlamaTiedMatchesFullForward) {
  expect_decode_matches(tiny("llama", DType::f32, true), 1e-5);
}
TEST(Decode, Gpt2MatchesFullForward) { expect_decode_matches(tiny("gpt2"), 1e-5); }
// bf16: q, k, v and the attention output are rounded to bf16 on both sides; a different f32
// summation order can move an attention output by one bf16 ulp (2^-8 relative)
TEST(Decode, Bf16MatchesFullForward) { expect_decode_matches(tiny("llama", DType::bf16), 2e-2); }
// ... where a decode step reads bf16 copies of the weights: a tied head, GPT-2's Conv1D, fused
// c_attn and tied wte, stacked experts, NormFormer's head-scaled projection (a computed weight)
TEST(Decode, Bf16EveryArchitectureMatchesFullForward) {
  expect_decode_matches(tiny("llama", DType::bf16, true), 2e-2);
  expect_decode_matches(tiny("gpt2", DType::bf16), 2e-2);
  for (const char* arch : {"llama", "gpt2"})
    expect_decode_matches(tiny_moe_normformer(arch, DType::bf16), 2e-2);
}

// Under bf16 a decode step casts no parameter: every weight a matmul reads is a bf16 param, the
// copy of a master the model declares (model.h: ModelGraph::weight_copies), which DecodeRunner
// rounds once; only a computed weight (NormFormer's head-scaled projection) is cast per token.
TEST(Decode, Bf16StepReadsWeightCopiesAndCastsNoParam) {
  for (const char* arch : {"llama", "gpt2"}) {
    models::ModelConfig m = tiny(arch, DType::bf16, true);
    m.moe.experts = 4;
    m.moe.dropless = true;
    const models::ModelGraph g = models::build_decode(m, 1, 1, kT);
    std::set<std::string> masters;
    for (const auto& i : models::param_infos(m)) masters.insert(i.name);
    ASSERT_FALSE(g.weight_copies.empty()) << arch;
    for (const auto& [copy, master] : g.weight_copies) {
      const ir::Value& v = g.graph.value(copy);
      EXPECT_EQ(v.kind, ir::ValueKind::param) << v.name;
      EXPECT_EQ(v.type.dtype, DType::bf16) << v.name;
      EXPECT_EQ(v.name, models::weight_copy_name(master, DType::bf16));
      EXPECT_TRUE(masters.count(master)) << master;
      EXPECT_EQ(v.type.shape, g.graph.value(g.graph.find(master)).type.shape) << v.name;
    }
    int matmuls = 0;
    for (const ir::Node& n : g.graph.nodes()) {
      if (n.op == ir::Op::cast) {
        EXPECT_NE(g.graph.value(n.inputs[0]).kind, ir::ValueKind::param)
            << arch << ": " << g.graph.value(n.inputs[0]).name << " is cast every token";
      }
      if (n.op == ir::Op::matmul || n.op == ir::Op::grouped_matmul) ++matmuls;
    }
    EXPECT_GT(matmuls, 0);
    // f32 declares no copies
    EXPECT_TRUE(models::build_decode(tiny(arch), 1, 1, kT).weight_copies.empty()) << arch;
  }
}

// MoE (dropless, so the full forward drops no token either, as decoding never does) with
// NormFormer: routing depends only on each token's own activations
TEST(Decode, DroplessMoeNormFormerMatchesFullForward) {
  for (const char* arch : {"llama", "gpt2"}) expect_decode_matches(tiny_moe_normformer(arch), 1e-5);
}

TEST(Decode, BadInputsAreErrors) {
  const models::ModelConfig m = tiny("llama");
  train::ParamStore p(m);
  p.init_random(1);
  EXPECT_THROW(DecodeRunner(m, p, 33, "<test>"), Error);  // longer than max_seq_len
  EXPECT_THROW(DecodeRunner(m, p, 0, "<test>"), Error);
  DecodeRunner d(m, p, 8, "<test>");
  const int32_t bad[2] = {3, 61};
  try {
    d.feed(bad, 2);
    ADD_FAILURE() << "token id 61 of a 61-token vocabulary was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("outside the vocabulary"), std::string::npos) << e.what();
  }
  const int32_t ok[9] = {};
  d.reset();
  EXPECT_THROW(d.feed(ok, 9), Error);
  EXPECT_THROW(d.feed(ok, 0), Error);
}

}  // namespace
}  // namespace loom::infer
