// Megatron sequence parallelism moves the bytes Korthikanti et al. 2022 (arXiv 2205.05198, §4.2.2)
// say it moves: each of tensor parallelism's four activation all-reduces per layer (two forward,
// two backward) becomes one all-gather and one reduce-scatter of the same activation, on the
// tensor-parallel axis; the weights stay split (never gathered), attention needs no all-to-all,
// and the batch stays split on the data axis (no activation moves over it). Checked on the lowered
// program of Llama (grouped-query heads) and GPT-2, in f32 and bf16, with and without a data axis.
//
// The embedding and the head are vocabulary-parallel (Megatron-LM's VocabParallelEmbedding and
// parallel cross-entropy): tensor parallelism adds the embedding's partial output (forward) and the
// head's partial input gradient (backward) to the layers' all-reduces, 4L + 2, and sequence
// parallelism makes both reduce-scatters and gathers the head's input and the embedding's output
// gradient (from which the table's block of the gradient is made), 4L + 2 each, as Megatron-LM
// does. A tied table (GPT-2's wte) is the head too: its gradient is made from the time-split stream
// and reduce-scattered (a weight's, not counted here), 4L + 1 gathers. Nothing with the vocabulary
// in its shape is gathered or all-reduced on the model axis: not the logits, not a weight, not a
// gradient.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <map>

#include "loom/core/dtype.h"
#include "loom/core/shape.h"
#include "loom/models/model.h"
#include "loom/passes/pipeline.h"
#include "loom/train/compile.h"
#include "loom/train/config.h"

namespace loom {
namespace {

struct Traffic {
  int64_t count = 0;
  int64_t bytes = 0;  // the whole buffer: an all-gather's result, the others' operand
};

// The collectives of a lowered program, keyed "op axis", counting only activations: [b, t, d]
// with a rank's batch b and the whole time t.
std::map<std::string, Traffic> activation_traffic(const ir::Graph& g, int64_t b, int64_t t) {
  std::map<std::string, Traffic> traffic;
  for (const ir::Node& n : g.nodes()) {
    if (n.op != ir::Op::all_gather && n.op != ir::Op::reduce_scatter &&
        n.op != ir::Op::all_reduce && n.op != ir::Op::all_to_all)
      continue;
    const ir::TensorType& whole =
        g.value(n.op == ir::Op::all_gather ? n.outputs[0] : n.inputs[0]).type;
    if (whole.shape.size() != 3 || whole.shape[0] != b || whole.shape[1] != t) continue;
    Traffic& x = traffic[fmt::format("{} {}", ir::op_name(n.op), n.attr_str("axis"))];
    ++x.count;
    x.bytes += numel(whole.shape) * int64_t(dtype_size(whole.dtype));
  }
  return traffic;
}

struct Case {
  const char* config;
  const char* dtype;
  int64_t data, model;
};

class SequenceParallel : public ::testing::TestWithParam<Case> {};

TEST_P(SequenceParallel, MovesTheActivationsOfTensorParallelismAsGathersAndScatters) {
  const Case c = GetParam();
  const int64_t batch = 2 * c.data, seq = 32;
  const train::Config cfg = train::load_config(
      std::string(LOOM_SOURCE_DIR) + "/configs/" + c.config + ".toml",
      {std::string("model.dtype=") + c.dtype, "train.batch_size=" + std::to_string(batch),
       "train.seq_len=" + std::to_string(seq)});
  const int64_t layers = cfg.model.n_layers, d = cfg.model.d_model;
  bool tied = true;
  for (const auto& p : models::param_infos(cfg.model)) tied &= p.name != "lm_head.weight";

  auto lowered = [&](bool sequence) {
    passes::Options o = train::step_options(cfg, passes::StepKind::train, 0);
    std::vector<std::pair<std::string, int64_t>> axes;
    if (c.data > 1) axes.push_back({"data", c.data});
    axes.push_back({"model", c.model});
    o.plan.mesh = shard::Mesh(axes, "[plan] mesh");
    o.plan.tactics.push_back({"megatron", "model"});
    if (sequence) o.plan.tactics.push_back({"sequence", "model"});
    if (c.data > 1) o.plan.tactics.push_back({"data", "data"});
    o.ranks = c.data * c.model;
    return passes::compile(o, passes::Stage::lowered);
  };
  const passes::Compilation tp = lowered(false), sp = lowered(true);
  const auto tpt = activation_traffic(tp.rank.graph, batch / c.data, seq),
             spt = activation_traffic(sp.rank.graph, batch / c.data, seq);

  // one activation of a rank's batch, whole in time, in f32 (the partial sums' dtype)
  const int64_t act = (batch / c.data) * seq * d * 4;
  auto get = [](const std::map<std::string, Traffic>& t, const std::string& k) {
    auto it = t.find(k);
    return it == t.end() ? Traffic{} : it->second;
  };
  // tensor parallelism: four all-reduces of the activation per layer, the embedding's and the
  // head's
  EXPECT_EQ(get(tpt, "all_reduce model").count, 4 * layers + 2);
  EXPECT_EQ(get(tpt, "all_reduce model").bytes, (4 * layers + 2) * act);
  EXPECT_EQ(tpt.size(), 1u) << "tensor parallelism moves only its all-reduces";

  // sequence parallelism: each becomes a reduce-scatter and an all-gather of the same activation
  // (an all-gather of bf16 when the matmul after it reads bf16: half the bytes, still the paper's
  // count)
  const Traffic rs = get(spt, "reduce_scatter model"), ag = get(spt, "all_gather model");
  EXPECT_EQ(rs.count, 4 * layers + 2);
  EXPECT_EQ(rs.bytes, (4 * layers + 2) * act);
  // the stream before the head gathered once more for the backward: the head's weight gradient
  // (a tied table's term of it too) is made split by vocabulary from it, never reduced whole
  const int64_t gathers = 4 * layers + 2;
  EXPECT_EQ(ag.count, gathers);
  for (const ir::Node& n : sp.rank.graph.nodes()) {
    if (n.op != ir::Op::reduce_scatter && n.op != ir::Op::all_reduce) continue;
    EXPECT_NE(sp.rank.graph.value(n.inputs[0]).type.shape,
              (Shape{cfg.model.vocab_size, cfg.model.d_model}))
        << "%" << sp.rank.graph.value(n.outputs[0]).name << " reduces the whole table's gradient"
        << (tied ? " (tied)" : "");
  }
  const int64_t gathered = std::string(c.dtype) == "bf16" ? act / 2 : act;
  EXPECT_LE(ag.bytes, gathers * act);
  EXPECT_GE(ag.bytes, gathers * gathered);
  for (const auto& [k, x] : spt)
    EXPECT_TRUE(k == "reduce_scatter model" || k == "all_gather model")
        << k << ": " << x.count << " collectives of " << x.bytes << " bytes";

  // and no weight is gathered: megatron's column/row layout survives the bf16 casts
  for (const ir::Node& n : sp.rank.graph.nodes()) {
    if (n.op != ir::Op::all_gather) continue;
    EXPECT_EQ(sp.rank.graph.value(n.inputs[0]).type.shape.size(), 3u)
        << "%" << sp.rank.graph.value(n.outputs[0]).name << " gathers a weight";
  }
  // vocabulary-parallel: the logits stay split into the loss, whose statistics are gathered
  for (const passes::Compilation* p : {&tp, &sp}) {
    const ir::Graph& g = p->rank.graph;
    int stats = 0;
    for (const ir::Node& n : g.nodes()) {
      stats += n.op == ir::Op::softmax_stats;
      // (untied, not even a reduce-scatter: the table's gradient is made in its blocks)
      const bool moves = n.op == ir::Op::all_gather || n.op == ir::Op::all_reduce ||
                         (!tied && n.op == ir::Op::reduce_scatter);
      if (!moves || n.attr_str("axis") != "model") continue;
      for (int v : {n.inputs[0], n.outputs[0]})
        for (int64_t dim : g.value(v).type.shape)
          EXPECT_NE(dim, cfg.model.vocab_size)
              << "%" << g.value(n.outputs[0]).name << " moves the vocabulary whole";
    }
    EXPECT_EQ(stats, 1);
  }
}

// A vocabulary the tensor-parallel axis does not divide stays whole: the logits are gathered into
// one cross_entropy of two inputs, and no shard_index or softmax_stats is made.
TEST(VocabularyParallel, AVocabularyTheAxisDoesNotDivideStaysWhole) {
  for (int64_t vocab : {int64_t(257), int64_t(256)}) {
    const train::Config cfg = train::load_config(
        std::string(LOOM_SOURCE_DIR) + "/configs/tiny-llama.toml",
        {"model.vocab_size=" + std::to_string(vocab), "train.batch_size=2", "train.seq_len=16"});
    passes::Options o = train::step_options(cfg, passes::StepKind::train, 0);
    o.plan.mesh = shard::Mesh({{"model", 2}}, "[plan] mesh");
    o.plan.tactics.push_back({"megatron", "model"});
    o.ranks = 2;
    const passes::Compilation p = passes::compile(o, passes::Stage::lowered);
    int split = 0, ce_inputs = 0;
    for (const ir::Node& n : p.rank.graph.nodes()) {
      split += n.op == ir::Op::shard_index || n.op == ir::Op::softmax_stats;
      if (n.op == ir::Op::cross_entropy) ce_inputs = int(n.inputs.size());
    }
    SCOPED_TRACE(vocab);
    EXPECT_EQ(split, vocab % 2 ? 0 : 4);  // split: the embedding's, its backward's, the loss's two
    EXPECT_EQ(ce_inputs, vocab % 2 ? 2 : 3);
  }
}

INSTANTIATE_TEST_SUITE_P(Plans, SequenceParallel,
                         ::testing::Values(Case{"tiny-llama", "f32", 1, 2},
                                           Case{"tiny-llama", "bf16", 2, 2},
                                           Case{"tiny-llama", "f32", 2, 2},
                                           Case{"tiny-gpt2", "bf16", 1, 4},
                                           Case{"tiny-gpt2", "f32", 2, 2}),
                         [](const auto& info) {
                           std::string s = std::string(info.param.config) + "_" + info.param.dtype +
                                           "_data" + std::to_string(info.param.data) + "_model" +
                                           std::to_string(info.param.model);
                           for (char& ch : s)
                             if (ch == '-') ch = '_';
                           return s;
                         });

}  // namespace
}  // namespace loom
