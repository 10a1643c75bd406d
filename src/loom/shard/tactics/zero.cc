// fsdp, zero1, zero2: the ZeRO family. Each splits every parameter's AdamW moments over the axis,
// on the first dim the parameter's current split and the axis still divide (a parameter no dim of
// which divides, such as a norm weight of odd size, stays whole):
//
//   zero1  moments split; the gradient stays whole (all-reduced); the update runs on this rank's
//          block and the new parameter is all-gathered back
//   zero2  as zero1, with the gradient reduce-scattered to the moments' blocks
//   fsdp   (ZeRO-3) the parameter itself stored split too; every consumer but the optimizer sees it
//          as it was before this tactic (`use`), so lowering all-gathers it before each use
//
// They split every parameter's state over the axis, so none follows another of them, megatron or
// expert on the same axis (a value would be split over it twice).
#include "loom/shard/tactic.h"

namespace loom::shard {

namespace {

enum class Stage { zero1, zero2, fsdp };

void apply_zero(TacticContext& c, Stage stage) {
  Annotations& ann = c.annotations();
  for (int p : c.params()) {
    const Sharding before = c.current(p);
    const int d = c.divisible_dim(p, before);
    if (d < 0) continue;  // too small to split: stays whole
    const Sharding after = c.with_axis(p, before, size_t(d));
    if (stage == Stage::fsdp) {
      Sharding use = ann.count(p) && ann[p].has_use ? ann[p].use : before;
      c.set(p, after);
      ann[p].has_use = true;
      ann[p].use = use;
    }
    const TacticContext::OptimizerEdges* e = c.edges(p);
    if (!e) continue;  // a graph without an optimizer (gradients only)
    c.set(e->m, c.with_axis(e->m, c.current(e->m), size_t(d)));
    c.set(e->v, c.with_axis(e->v, c.current(e->v), size_t(d)));
    // zero1 keeps the gradient whole (all-reduced); zero2 and fsdp reduce-scatter it
    if (stage == Stage::zero1)
      c.set(e->grad, before);
    else
      c.set(e->grad, c.with_axis(e->grad, before, size_t(d)));
  }
}

template <Stage S>
void apply(TacticContext& c, const Tactic&) {
  apply_zero(c, S);
}

// What the three share: they read every parameter and cannot follow one another, megatron or
// expert on the same axis.
TacticDef zero_def(std::string_view name, std::string_view summary,
                   void (*apply)(TacticContext&, const Tactic&)) {
  return {.name = name,
          .summary = summary,
          .selects = "every parameter; its optimizer edges",
          .not_after = {"fsdp", "zero1", "zero2", "megatron", "expert", "pipeline"},
          .apply = apply};
}

}  // namespace

TacticDef fsdp_tactic() {
  return zero_def("fsdp", "ZeRO-3: parameters, gradients and AdamW moments stored split",
                  apply<Stage::fsdp>);
}

TacticDef zero1_tactic() {
  return zero_def("zero1", "AdamW moments split; gradients all-reduced whole", apply<Stage::zero1>);
}

TacticDef zero2_tactic() {
  return zero_def("zero2", "AdamW moments split; gradients reduce-scattered to their blocks",
                  apply<Stage::zero2>);
}

}  // namespace loom::shard
