// The tactic table (shard/tactic.h) against what the tactics do: every entry is complete and
// findable by its name, and each tactic's `not_after` is exactly the tactics apply refuses it after
// on one axis, so the table that search and the config read cannot drift from the behaviour.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "loom/core/error.h"
#include "loom/passes/pipeline.h"
#include "loom/shard/tactic.h"
#include "loom/train/compile.h"
#include "loom/train/config.h"

namespace loom {
namespace {

// The training graph of a tiny Mixture-of-Experts Llama: it has every role a tactic reads (batch
// inputs, column- and row-parallel weights, experts, norms).
passes::Compilation tiny_moe_train() {
  const train::Config cfg =
      train::load_config(std::string(LOOM_SOURCE_DIR) + "/configs/tiny-moe.toml");
  passes::Options o = train::step_options(cfg, passes::StepKind::train, 0);
  return passes::compile(o, passes::Stage::train);
}

// Whether the plan [a, b] on mesh {x = 2} applies to the training graph.
bool applies(const passes::Compilation& c, const shard::TacticDef& a, const shard::TacticDef& b) {
  shard::Plan plan;
  plan.mesh = shard::Mesh({{"x", 2}}, "[plan] mesh");
  for (const shard::TacticDef* d : {&a, &b}) {
    shard::Tactic t{std::string(d->name), "x", "", -1};
    if (d->takes_pattern) t.pattern = "*.self_attn.q_proj.weight", t.dim = 0;
    plan.tactics.push_back(t);
  }
  try {
    shard::apply_tactics(c.model.graph, plan, c.model.roles);
    return true;
  } catch (const Error&) {
    return false;
  }
}

TEST(TacticTable, EveryEntryIsCompleteAndFoundByName) {
  std::set<std::string_view> names;
  for (const shard::TacticDef& d : shard::tactic_defs()) {
    EXPECT_FALSE(d.name.empty());
    EXPECT_TRUE(names.insert(d.name).second) << "two tactics named " << d.name;
    EXPECT_FALSE(d.summary.empty()) << d.name;
    EXPECT_FALSE(d.selects.empty()) << d.name;
    EXPECT_TRUE(d.apply) << d.name;
    EXPECT_EQ(shard::find_tactic(d.name), &d);
  }
  EXPECT_EQ(shard::find_tactic("ddp"), nullptr);
  EXPECT_EQ(shard::tactic_kinds().size(), shard::tactic_defs().size());
}

// On one axis, b after a is refused exactly when b.not_after names a (shard, whose conflicts depend
// on its pattern, only after data).
TEST(TacticTable, NotAfterIsWhatApplyRefuses) {
  const passes::Compilation c = tiny_moe_train();
  ASSERT_FALSE(c.model.roles.experts.empty());
  int refused = 0;
  for (const shard::TacticDef& a : shard::tactic_defs())
    for (const shard::TacticDef& b : shard::tactic_defs()) {
      if ((a.takes_pattern || b.takes_pattern) && a.name != "data") continue;
      const bool declared =
          std::find(b.not_after.begin(), b.not_after.end(), a.name) != b.not_after.end();
      refused += declared;
      EXPECT_EQ(applies(c, a, b), !declared)
          << b.name << " after " << a.name << " on one axis: not_after says "
          << (declared ? "refused" : "applies");
    }
  // data, the ZeRO three, megatron, expert, sequence; pipeline (after any of the seven others and
  // itself), and each of the seven after pipeline
  EXPECT_EQ(refused, 2 + 3 * 5 + 4 + 4 + 1 + 8 + 7);
}

}  // namespace
}  // namespace loom
