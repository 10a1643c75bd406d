// Distributed parity under the local backend: every tactic's N-rank run (ranks as threads) gives
// the losses, gradients and parameters of the 1-rank run of the same config (plan_parity.h).
#include "plan_parity.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <future>
#include <mutex>

#include "loom/comm/local.h"
#include "loom/core/file.h"
#include "loom/core/testing.h"
#include "loom/ops/op.h"
#include "loom/passes/rewrite.h"
#include "loom/runtime/memory_plan.h"
#include "loom/train/checkpoint.h"
#include "loom/train/checkpoint_writer.h"
#include "loom/train/compile.h"
#include "loom/train/plan_island.h"

namespace loom::train::parity {
namespace {

// Runs fn on every rank of the plan's mesh (threads) and returns rank 0's result.
template <class T>
T on_ranks(const Config& cfg, const std::function<T(const runtime::MeshComms&)>& fn) {
  T result{};
  std::mutex mu;
  comm::run_local(int(cfg.plan.plan.mesh.size()), [&](comm::Communicator& c) {
    runtime::MeshComms mc(c, cfg.plan.plan.mesh);
    T r = fn(mc);
    std::lock_guard<std::mutex> lock(mu);
    if (c.rank() == 0) result = std::move(r);
  });
  return result;
}

// cfg trained on its plan's ranks (threads): rank 0's run.
TrainRun trained_on_ranks(const Config& cfg) {
  return on_ranks<TrainRun>(cfg, [&](const runtime::MeshComms& mc) { return train_run(cfg, &mc); });
}

// Every loss, gradient norm, parameter and AdamW moment of y is x's, bit for bit.
void expect_same_bits(const TrainRun& x, const TrainRun& y) {
  EXPECT_EQ(x.losses, y.losses);
  EXPECT_EQ(x.grad_norms, y.grad_norms);
  for (const auto& [param, v] : x.params) {
    EXPECT_EQ(v, y.params.at(param)) << param;
    EXPECT_EQ(x.m.at(param), y.m.at(param)) << param << ": moment m";
    EXPECT_EQ(x.v.at(param), y.v.at(param)) << param << ": moment v";
  }
}

// The train step of cfg as a rank of its plan's mesh compiles it.
CompiledStep compiled(const Config& cfg) {
  return compile_step(cfg, passes::StepKind::train, true, cfg.plan.plan.mesh.size());
}

class PlanParity : public ::testing::TestWithParam<Case> {};

TEST_P(PlanParity, TrainingMatchesOneRank) {
  Config cfg = config(GetParam());
  TrainRun ref = train_run(single(cfg), nullptr);
  TrainRun got = trained_on_ranks(cfg);
  for (const auto& e : compare_training(got, ref)) ADD_FAILURE() << e;
}

TEST_P(PlanParity, GradientsMatchOneRank) {
  Config cfg = config(GetParam());
  auto ref = grads_run(single(cfg), nullptr);
  auto got = on_ranks<std::map<std::string, std::vector<float>>>(
      cfg, [&](const runtime::MeshComms& mc) { return grads_run(cfg, &mc); });
  for (const auto& e : compare_grads(got, ref)) ADD_FAILURE() << e;
}

class PipelineParity : public ::testing::TestWithParam<Case> {};

TEST_P(PipelineParity, TrainingMatchesOneRank) {
  Config cfg = config(GetParam());
  TrainRun ref = train_run(single(cfg), nullptr);
  TrainRun got = trained_on_ranks(cfg);
  for (const auto& e : compare_training(got, ref)) ADD_FAILURE() << e;
}

INSTANTIATE_TEST_SUITE_P(Pipeline, PipelineParity, ::testing::ValuesIn(pipeline_cases()),
                         [](const auto& info) { return info.param.name; });

// Each stage's program holds its own part: the embedding on the first stage, the loss on the
// last, every parameter's AdamW on exactly one stage, and each value sent from one stage to
// another received there with the same tag and type.
TEST(Pipeline, EachStageRunsItsPartAndEverySendIsReceived) {
  for (const Case& pc : pipeline_cases()) {
    if (pc.mesh != "{pipe=4}") continue;
    SCOPED_TRACE(pc.name);
    const Config cfg = config(pc);
    const int64_t p = 4;
    const int64_t m =
        shard::pipeline_microbatches(cfg.plan.plan, *shard::find_pipeline(cfg.plan.plan));
    std::map<std::string, int> updated;       // parameter -> the stages that update it
    std::map<std::string, int64_t> stage_of;  // parameter -> a stage that updates it
    // (from, to, tag) -> the bytes sent, and received
    std::map<std::tuple<int64_t, int64_t, int64_t>, int64_t> sent, received;
    for (int64_t s = 0; s < p; ++s) {
      const CompiledStep st = compile_step(cfg, passes::StepKind::train, true, p, s);
      const ir::Graph& g = st.c.rank.graph;
      int embeddings = 0, losses = 0;
      for (const ir::Node& n : g.nodes()) {
        embeddings += n.op == ir::Op::embedding;
        losses += n.op == ir::Op::cross_entropy;
        if (n.op == ir::Op::adamw) {
          ++updated[g.value(n.inputs[0]).name];
          stage_of[g.value(n.inputs[0]).name] = s;
        }
        if (n.op == ir::Op::send)
          sent[{s, n.attr_int("peer"), n.attr_int("tag")}] =
              runtime::value_bytes(g.value(n.inputs[0]));
        if (n.op == ir::Op::recv)
          received[{n.attr_int("peer"), s, n.attr_int("tag")}] =
              runtime::value_bytes(g.value(n.outputs[0]));
      }
      EXPECT_EQ(embeddings, s == 0 ? m : 0) << "stage " << s;  // one per micro-batch
      EXPECT_EQ(losses, s == p - 1 ? m : 0) << "stage " << s;
    }
    ParamStore params(cfg.model);
    EXPECT_EQ(updated.size(), params.infos().size());
    for (const auto& [name, n] : updated) EXPECT_EQ(n, 1) << name;
    // interleaved, 8 groups in 8 chunks: stage s holds chunks s and s + 4, the embedding and
    // layers.3 on stage 0, ..., layers.2 and the head on stage 3
    if (pc.name == "pipeline4_interleaved") {
      for (const auto& [name, s] : stage_of) {
        if (name.rfind("model.layers.", 0) == 0)
          EXPECT_EQ(s, (std::stoi(name.substr(13)) + 1) % 4) << name;
        else
          EXPECT_EQ(s, name == "model.embed_tokens.weight" ? 0 : 3) << name;
      }
    }
    EXPECT_EQ(sent, received);
    EXPECT_GT(sent.size(), 0u);
  }
}

// A pipeline plan that cannot run is refused before any rank starts, naming what is wrong.
TEST(Pipeline, BadPlansAreClearErrors) {
  auto error = [](const std::string& model, const std::string& mesh, const std::string& tactics,
                  std::vector<std::string> sets = {}) -> std::string {
    try {
      check_plan(config({"bad", mesh, tactics, model, std::move(sets)}));
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  const std::string pipe = R"({kind="pipeline",axis="pipe"})";
  auto has = [](const std::string& msg, const std::string& part) {
    return msg.find(part) != std::string::npos;
  };
  // 4 groups: the embedding, 2 blocks, the head
  std::string e = error("tiny", "{pipe=8}", R"([{kind="pipeline",axis="pipe",microbatches=4}])");
  EXPECT_TRUE(has(e, "8 stages") && has(e, "4 parameter groups")) << e;
  e = error("tiny", "{pipe=2}", R"([{kind="pipeline",axis="pipe",microbatches=3}])");
  EXPECT_TRUE(has(e, "microbatches = 3 does not divide [train] batch_size = 4")) << e;
  e = error("tiny", "{pipe=2}", R"([{kind="pipeline",axis="pipe",schedule="zigzag"}])");
  EXPECT_TRUE(has(e, "schedule 'zigzag' is not one of gpipe, 1f1b, interleaved")) << e;
  e = error("tiny", "{pipe=2}", R"([{kind="pipeline",axis="pipe",virtual_stages=2}])");
  EXPECT_TRUE(has(e, "virtual_stages = 2 under schedule '1f1b'")) << e;
  e = error("tiny", "{pipe=2}",
            R"([{kind="pipeline",axis="pipe",schedule="interleaved",microbatches=1}])");
  EXPECT_TRUE(has(e, "microbatches = 1 is not a multiple of 2")) << e;
  e = error("tiny", "{pipe=2}",
            R"([{kind="pipeline",axis="pipe",schedule="interleaved",virtual_stages=4}])");
  EXPECT_TRUE(has(e, "2 stages (axis 'pipe') of 4 chunks each") && has(e, "4 parameter groups"))
      << e;
  e = error("tiny", "{pipe=2}", R"([{kind="data",axis="pipe",microbatches=2}])");
  EXPECT_TRUE(has(e, "a data tactic takes no microbatches")) << e;
  e = error("tiny", "{pipe=2}", "[" + pipe + R"(,{kind="data",axis="pipe"}])");
  EXPECT_TRUE(has(e, "axis 'pipe' also carries")) << e;
  e = error("gpt2", "{pipe=2}", "[" + pipe + "]");  // the head reads the embedding's table
  EXPECT_TRUE(has(e, "tied embedding")) << e;
  e = error("tiny", "{pipe=2}", "[" + pipe + "]", {"train.grad_accum=2"});
  EXPECT_TRUE(has(e, "grad_accum")) << e;
  e = error("tiny", "{data=2}", R"([{kind="pipeline",axis="pipe"}])");
  EXPECT_TRUE(has(e, "axis 'pipe' is not in the mesh")) << e;
}

// Under bf16 compute (weights cast before each matmul, recast for the backward: passes/recast.cc
// renumbers the global graph, the pipeline's records with it) two stages train as one process
// does: each step's loss within bf16's rounding of the micro-batches' sums.
TEST(Pipeline, Bf16TrainsAsOneProcessDoes) {
  Case c = pipeline_cases()[1];
  c.sets.push_back("model.dtype=bf16");
  const Config cfg = config(c);
  const TrainRun ref = train_run(single(cfg), nullptr);
  const TrainRun got = trained_on_ranks(cfg);
  EXPECT_EQ(close(got.losses, ref.losses, 1e-2, 0, "loss"), "");
}

// A moment read by itself (a whole checkpoint reads them one by one) is its stage's, whichever rank
// asks: only the stage owning a parameter updates it, the other stages' copies stay as they began.
TEST(Pipeline, AMomentIsReadFromItsStage) {
  const Config cfg = config(pipeline_cases()[1]);
  auto moments = [](const Config& c, const runtime::MeshComms* mc) {
    ParamStore p(c.model);
    p.init_random(11);
    StepRunner r(c, p, StepRunner::Mode::train, mc);
    for (int64_t s = 1; s <= 3; ++s) r.step(batch(c, s).data(), lr_at(s));
    std::map<std::string, std::vector<float>> m;
    for (const auto& info : p.infos()) {
      m[info.name].resize(size_t(numel(info.shape)));
      r.read_moment(info.name, autodiff::Moment::v, m[info.name].data());
    }
    return m;
  };
  const auto ref = moments(single(cfg), nullptr);
  const auto got = on_ranks<std::map<std::string, std::vector<float>>>(
      cfg, [&](const runtime::MeshComms& mc) { return moments(cfg, &mc); });
  for (const auto& [name, want] : ref)
    EXPECT_EQ(close_norm(got.at(name), want, 1e-3, "adam.v " + name), "");
}

// 1F1B keeps at most p - s micro-batches' activations on stage s, GPipe all m: on the first of
// two stages with 4 micro-batches, the planned arena of 1F1B is the smaller.
TEST(Pipeline, OneFOneBHoldsFewerActivationsThanGPipe) {
  Case c = pipeline_cases()[0];
  const Config gpipe = config(c);
  c.tactics = R"([{kind="pipeline",axis="pipe",schedule="1f1b",microbatches=4}])";
  const Config ofob = config(c);
  auto arena = [](const Config& cfg) {
    const CompiledStep st = compile_step(cfg, passes::StepKind::train, true, 2, 0);
    return runtime::plan_memory(st.c.rank.graph).arena_bytes;
  };
  const int64_t a = arena(gpipe), b = arena(ofob);
  std::printf("stage 0 of 2, 4 micro-batches: arena gpipe %lld bytes, 1f1b %lld\n", (long long)a,
              (long long)b);
  EXPECT_LT(b, a);
}

// Beside a pipeline, recompute runs before the stages are cut (a node made again runs in its
// backward reader's item): with each schedule, and beside fsdp (whose gathers reshard makes
// again), every loss, gradient norm, parameter and moment bit is recompute = "none"'s in f32; the
// first stage makes nodes again and plans a smaller arena under full (fewer activations live).
TEST(Pipeline, RecomputeChangesNoBitInF32) {
  for (const char* name : {"pipeline2_gpipe", "pipeline4_1f1b", "pipeline4_interleaved",
                           "pipeline_fsdp_2x2", "pipeline_megatron_sequence_2x2"})
    for (const char* policy : {"selective", "full"}) {
      SCOPED_TRACE(std::string(name) + ", recompute = " + policy);
      Case kept;
      for (const Case& c : pipeline_cases())
        if (c.name == name) kept = c;
      ASSERT_EQ(kept.name, name);
      Case again = kept;
      again.sets.push_back(std::string("passes.recompute=") + policy);
      const Config a = config(kept), b = config(again);
      const TrainRun x = trained_on_ranks(a), y = trained_on_ranks(b);
      EXPECT_EQ(x.recomputed, 0);
      EXPECT_GT(y.recomputed, 0) << "recompute made nothing again on stage 0";
      expect_same_bits(x, y);
      if (std::string(policy) != "full") continue;
      const int64_t ranks = a.plan.plan.mesh.size();
      auto arena = [&](const Config& cfg) {
        return runtime::plan_memory(
                   compile_step(cfg, passes::StepKind::train, true, ranks, 0).c.rank.graph)
            .arena_bytes;
      };
      const int64_t before = arena(a), after = arena(b);
      std::printf("%s, stage 0: arena %lld bytes, %lld with recompute = full\n", name,
                  (long long)before, (long long)after);
      EXPECT_LT(after, before);
    }
}

// [passes] recompute = "selective", "selective_op" and "full" make the same ops again on the same
// inputs: the program changed (fewer saved activation bytes, recomputed nodes present where
// recompute = "none" has none), and in f32 the same plan's losses, gradient norms, parameters and
// both AdamW moments are bit for bit those of recompute = "none".
TEST(Recompute, ChangesNoBitInF32) {
  for (const char* name :
       {"fsdp", "gpt2_fsdp", "mid_fsdp_megatron_2x2", "mid_fsdp_megatron_sequence_2x2"})
    for (const char* policy : {"selective", "selective_op", "full"}) {
      SCOPED_TRACE(std::string(name) + ", recompute = " + policy);
      Case kept;
      for (const Case& c : cases())
        if (c.name == name) kept = c;
      Case again = kept;
      again.sets.push_back(std::string("passes.recompute=") + policy);
      const Config a = config(kept), b = config(again);
      ASSERT_EQ(a.model.dtype, DType::f32);
      const TrainRun x = trained_on_ranks(a), y = trained_on_ranks(b);
      EXPECT_EQ(x.recomputed, 0) << name;
      EXPECT_GT(y.recomputed, 0) << name << ": recompute made nothing again";
      EXPECT_LT(y.saved_bytes, x.saved_bytes) << name << ": recompute saved no activation bytes";
      expect_same_bits(x, y);
    }
}

// One process (no [plan]) runs its training graph through the scheduled stage when [passes]
// recompute asks for it (train/compile.h: CompiledStep::scheduled): fewer saved activations and
// recomputed nodes present, and in f32 every loss, gradient norm, parameter and moment (m and v)
// bit of recompute = "none"; also with gradient accumulation, where a micro-batch before the last
// runs a prefix of the program.
TEST(Recompute, OneProcessChangesNoBitInF32) {
  for (const char* model : {"tiny", "gpt2"})
    for (int accum : {1, 2}) {
      Case c{"one", "{data=2}", "[]", model, {"train.grad_accum=" + std::to_string(accum)}};
      const Config none = single(config(c));
      auto run = [&](const Config& cfg, int64_t* saved) {
        ParamStore p(cfg.model);
        p.init_random(11);
        StepRunner r(cfg, p, StepRunner::Mode::train, nullptr);
        *saved = r.activation_bytes();
        TrainRun out;
        out.recomputed = recomputed_nodes(r.program());
        for (int64_t s = 1; s <= 4; ++s) {
          out.losses.push_back(r.step(batch(cfg, s).data(), lr_at(s)));
          out.grad_norms.push_back(r.grad_norm());
        }
        read_state(p, r, out);
        return out;
      };
      int64_t kept_bytes = 0;
      const TrainRun x = run(none, &kept_bytes);
      for (auto policy : {passes::ScheduleOptions::Recompute::selective,
                          passes::ScheduleOptions::Recompute::selective_op,
                          passes::ScheduleOptions::Recompute::full}) {
        SCOPED_TRACE(std::string(model) + ", grad_accum " + std::to_string(accum) + ", " +
                     passes::recompute_name(policy));
        Config again = none;
        again.passes.recompute = policy;
        int64_t saved = 0;
        const TrainRun y = run(again, &saved);
        EXPECT_LT(saved, kept_bytes);
        EXPECT_EQ(x.recomputed, 0);
        EXPECT_GT(y.recomputed, 0) << "recompute made nothing again";
        expect_same_bits(x, y);
      }
    }
}

// Gradient accumulation under a plan is the full batch at once: k micro-batches of B rows under
// the plan train as one process does on one batch of k*B rows (the same tokens), within the parity
// bounds (the gradients are summed in another order). And the micro-batch prefix holds no
// optimizer node, while the whole program has one per parameter.
TEST(GradAccum, UnderAPlanMatchesTheFullBatch) {
  for (const char* name :
       {"fsdp_accum", "mid_fsdp_megatron_accum", "gpt2_megatron_sequence_accum"}) {
    SCOPED_TRACE(name);
    const Case c = case_named(name);
    ASSERT_EQ(c.name, name);
    const Config micro = config(c);
    ASSERT_GT(micro.train.grad_accum, 1);
    Config full = single(micro);
    full.train.batch_size *= full.train.grad_accum;
    full.train.grad_accum = 1;
    ASSERT_EQ(batch(full, 1), batch(micro, 1));
    const TrainRun ref = train_run(full, nullptr);
    const TrainRun got = trained_on_ranks(micro);
    for (const auto& e : compare_training(got, ref)) ADD_FAILURE() << e;
  }
}

// Data parallelism's gradients are summed unreduced across micro-batches and reduced once a step
// (DDP's no_sync): the micro-batch prefix of data_accum moves only the loss's scalars, and the
// whole program all of the gradients; fsdp's are reduce-scattered on every micro-batch (its sums
// are blocks), so its prefix moves them.
TEST(GradAccum, DataParallelGradientsAreReducedOnceAStep) {
  for (const char* name : {"data_accum", "fsdp_accum"}) {
    SCOPED_TRACE(name);
    const Case c = case_named(name);
    const Config cfg = config(c);
    const CompiledStep step = compiled(cfg);
    const ir::Graph& g = step.c.rank.graph;
    double prefix = 0, all = 0;  // bytes the reductions move
    for (const ir::Node& n : g.nodes()) {
      if (n.op != ir::Op::all_reduce && n.op != ir::Op::reduce_scatter) continue;
      const double b = double(runtime::value_bytes(g.value(n.inputs[0])));
      all += b;
      if (size_t(n.id) < step.micro_nodes()) prefix += b;
    }
    EXPECT_GT(all, 4e5);
    if (std::string(name) == "data_accum")
      EXPECT_LT(prefix, 64) << "a gradient reduced on a micro-batch before the last";
    else
      EXPECT_GT(prefix, 0.99 * all - 64) << "fsdp's gradients are reduced on every micro-batch";
  }
}

TEST(GradAccum, TheMicroBatchPrefixHoldsNoOptimizer) {
  for (const char* name : {"fsdp_accum", "mid_fsdp_megatron_accum", "moe_expert_fsdp_accum"}) {
    SCOPED_TRACE(name);
    const Case c = case_named(name);
    const Config cfg = config(c);
    const CompiledStep step = compiled(cfg);
    const ir::Graph& g = step.c.rank.graph;
    const size_t prefix = step.micro_nodes();
    ASSERT_GT(prefix, 0u);
    ASSERT_LT(prefix, g.nodes().size());
    int64_t in_prefix = 0, after = 0, assigns = 0;
    for (const ir::Node& n : g.nodes()) {
      const bool opt = ops::has_trait(n.op, ops::Trait::optimizer);
      (size_t(n.id) < prefix ? in_prefix : after) += opt;
      assigns += size_t(n.id) < prefix && n.op == ir::Op::assign;
    }
    EXPECT_EQ(in_prefix, 0);
    EXPECT_EQ(after, int64_t(step.c.grads.size()));
    EXPECT_EQ(assigns, int64_t(step.c.grads.size())) << "one gradient sum kept per parameter";
  }
}

// Sharded checkpoints (train/sharded_checkpoint.h): fsdp on 4 ranks saves each rank's blocks
// after step 3 (rank files and an index, no whole file); resumed under the same plan the next
// steps' losses are bit for bit the uninterrupted run's; under megatron 2 x fsdp 2 and under one
// process they are within the parity bounds. A missing rank file, an index that disagrees with the
// files, and a block of another shape are errors naming the file.
TEST(ShardedCheckpoint, ResumesUnderAnyPlan) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / fmt::format("loom-sharded-{}", ::getpid());
  fs::remove_all(dir);
  Case fsdp4 = case_named("fsdp");
  fsdp4.mesh = "{data=4}";
  const Config saver = config(fsdp4);
  const int64_t split = 3, last = 6;
  // the uninterrupted run, saving after step `split`
  std::string path;
  std::mutex mu;
  const std::vector<float> straight =
      on_ranks<std::vector<float>>(saver, [&](const runtime::MeshComms& mc) {
        ParamStore p(saver.model);
        p.init_random(11);
        StepRunner r(saver, p, StepRunner::Mode::train, &mc);
        std::vector<float> l;
        for (int64_t s = 1; s <= last; ++s) {
          l.push_back(r.step(batch(saver, s).data(), lr_at(s)));
          if (s == split) {
            const std::string at =
                save_checkpoint(dir.string(), p, r, {}, "config text", 0, mc.world().rank() == 0);
            std::lock_guard<std::mutex> lock(mu);
            if (!at.empty()) path = at;
          }
        }
        return l;
      });
  ASSERT_FALSE(path.empty());
  EXPECT_TRUE(is_sharded_checkpoint(path));
  EXPECT_FALSE(fs::exists(fs::path(path) / "model.safetensors"));
  for (int r = 0; r < 4; ++r) EXPECT_TRUE(fs::exists(fs::path(path) / rank_file_name(r))) << r;
  const std::vector<float> want(straight.begin() + split, straight.end());
  auto resumed = [&](const Config& cfg) {
    auto run = [&](const runtime::MeshComms* mc) {
      ParamStore p(cfg.model);
      StepRunner r(cfg, p, StepRunner::Mode::train, mc);
      load_checkpoint(path, p, r);
      r.release_params();
      std::vector<float> l;
      for (int64_t s = split + 1; s <= last; ++s)
        l.push_back(r.step(batch(cfg, s).data(), lr_at(s)));
      return l;
    };
    if (cfg.plan.plan.empty()) return run(nullptr);
    return on_ranks<std::vector<float>>(cfg,
                                        [&](const runtime::MeshComms& mc) { return run(&mc); });
  };
  EXPECT_EQ(resumed(saver), want) << "the same plan: bit for bit";
  // pipeline 2 x megatron 2: each rank reads every parameter's block (its stage's and the others',
  // which it holds too)
  const Case pipeline_megatron{"pipeline_megatron", "{pipe=2,model=2}",
                               R"([{kind="pipeline",axis="pipe"},{kind="megatron",axis="model"}])"};
  for (const Config& other :
       {config(case_named("fsdp_megatron_2x2")), config(pipeline_megatron), single(saver)}) {
    SCOPED_TRACE(other.plan.plan.empty() ? "one process" : other.plan.plan.mesh.to_string());
    EXPECT_EQ(close(resumed(other), want, 1e-5, 0, "loss"), "");
  }
  // damaged copies: each an error naming the file
  auto broken = [&](const std::string& name, const std::function<void(const fs::path&)>& harm,
                    const std::string& needle) {
    const fs::path copy = dir / name;
    fs::copy(path, copy, fs::copy_options::recursive);
    harm(copy);
    ParamStore p(saver.model);
    const Config one = single(saver);
    StepRunner r(one, p, StepRunner::Mode::train, nullptr);
    const std::string e = error_of([&] { load_checkpoint(copy.string(), p, r); });
    EXPECT_NE(e.find(needle), std::string::npos) << name << ": " << e;
  };
  broken(
      "missing_rank", [](const fs::path& c) { fs::remove(c / rank_file_name(2)); },
      rank_file_name(2) + " is missing");
  broken(
      "bad_index",
      [](const fs::path& c) {
        nlohmann::json j = read_json((c / kShardedIndex).string());
        j["model"].begin().value()["ranks"] = {0, 1, 2};
        write_file_atomic((c / kShardedIndex).string(), j.dump(1));
      },
      "is not the blocks' writers");
  broken(
      "bad_block",
      [&](const fs::path& c) {
        nlohmann::json j = read_json((c / kShardedIndex).string());
        auto t = j["model"].begin();
        t.value()["grid"] = {numel(t.value()["grid"].get<Shape>())};
        t.value()["sharding"] = "{_}";
        t.value()["ranks"] = {0};
        write_file_atomic((c / kShardedIndex).string(), j.dump(1));
      },
      "the index makes it f32");
  fs::remove_all(dir);
}

// An asynchronous sharded checkpoint (checkpoint_writer.h) on fsdp's 4 ranks, each rank's write
// held back while the ranks train two more steps (every poll, collective, finds it unfinished):
// the rank files, index, state and config are byte for byte those of a synchronous save at the
// same step, and nothing is in place before the commit.
TEST(ShardedCheckpoint, AnAsyncSaveWritesTheSameFiles) {
  namespace fs = std::filesystem;
  const fs::path root =
      fs::temp_directory_path() / fmt::format("loom-sharded-async-{}", ::getpid());
  fs::remove_all(root);
  Case fsdp4 = case_named("fsdp");
  fsdp4.mesh = "{data=4}";
  const Config cfg = config(fsdp4);
  std::mutex mu;
  std::string want, got;
  on_ranks<int>(cfg, [&](const runtime::MeshComms& mc) {
    const bool rank0 = mc.world().rank() == 0;
    ParamStore p(cfg.model);
    p.init_random(5);
    StepRunner r(cfg, p, StepRunner::Mode::train, &mc);
    for (int64_t s = 1; s <= 3; ++s) r.step(batch(cfg, s).data(), lr_at(s));
    const std::string a = save_checkpoint((root / "sync").string(), p, r, {}, "text", 0, rank0);
    std::promise<void> trained;
    std::shared_future<void> go = trained.get_future().share();
    CheckpointWriter w((root / "async").string(), 0, /*async=*/true, rank0);
    w.hold_writes([go] { go.wait(); });
    EXPECT_EQ(w.save(p, r, {}, "text"), "");
    for (int64_t s = 4; s <= 5; ++s) {
      r.step(batch(cfg, s).data(), lr_at(s));
      EXPECT_EQ(w.poll(), "");
    }
    EXPECT_TRUE(list_checkpoints((root / "async").string()).empty());
    trained.set_value();
    const std::string b = w.finish();
    std::lock_guard<std::mutex> lock(mu);
    if (rank0) want = a, got = b;
    return 0;
  });
  ASSERT_EQ(fs::path(got).filename(), "step_00000003");
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(want)) files.push_back(e.path().filename().string());
  EXPECT_EQ(files.size(), 7u) << "4 rank files, the index, state.json, config.toml";
  for (const std::string& f : files)
    EXPECT_EQ(read_file(got + "/" + f), read_file(want + "/" + f)) << f;
  fs::remove_all(root);
}

// An island scripted by sync: the k-th reads the parameters (k % 3 == 0: their sum, recorded),
// touches nothing (1), or adds 1e-3 to every parameter (2), through OuterSync::on_params.
class ScriptedIsland : public OuterSync {
 public:
  explicit ScriptedIsland(ParamStore& p) : p_(p) {}
  uint64_t id() const override { return 1; }
  int64_t inner_steps() const override { return 1; }
  bool sync(int64_t, double, bool) override {
    const int64_t k = k_++;
    if (k % 3 == 1) return true;
    if (hook_) hook_(k % 3 == 2);
    double sum = 0;
    for (const auto& info : p_.infos()) {
      float* x = p_.data(info.name);
      for (int64_t i = 0; i < numel(info.shape); ++i) {
        if (k % 3 == 2) x[i] += 1e-3f;
        sum += x[i];
      }
    }
    if (k % 3 == 0) seen.push_back(sum);
    return true;
  }
  nlohmann::json metrics() const override { return nlohmann::json::object(); }
  std::string summary() const override { return ""; }
  void on_params(std::function<void(bool)> hook) override { hook_ = std::move(hook); }
  std::vector<double> seen;

 private:
  ParamStore& p_;
  int64_t k_ = 0;
  std::function<void(bool)> hook_;
};

// PlanIsland (train/plan_island.h) on fsdp's 2 ranks follows its island's use of the parameters:
// a sync that reads them gathers every rank's blocks first (the island sees what one process
// sees), one that changes them brings the change to every rank's blocks (the losses after it are
// one process's), and one that touches neither gathers nor broadcasts anything.
TEST(PlanIsland, MovesParametersOnlyWhenItsIslandTouchesThem) {
  const Config cfg = config(case_named("fsdp"));
  const int64_t syncs = 6;
  // one process: the island on the store itself
  std::vector<float> want;
  std::vector<double> want_seen;
  {
    const Config one = single(cfg);
    ParamStore p(one.model);
    p.init_random(3);
    StepRunner r(one, p, StepRunner::Mode::train);
    ScriptedIsland island(p);
    island.on_params([&](bool) { r.push_params(); });
    for (int64_t s = 1; s <= syncs; ++s) {
      want.push_back(r.step(batch(one, s).data(), lr_at(s)));
      island.sync(1, 0, false);
      r.pull_params();
    }
    want_seen = island.seen;
  }
  std::mutex mu;
  std::vector<double> seen;
  on_ranks<int>(cfg, [&](const runtime::MeshComms& mc) {
    ParamStore p(cfg.model);
    p.init_random(3);
    StepRunner r(cfg, p, StepRunner::Mode::train, &mc);
    auto scripted = mc.world().rank() == 0 ? std::make_unique<ScriptedIsland>(p) : nullptr;
    ScriptedIsland* script = scripted.get();
    PlanIsland island(std::move(scripted), p, r, mc.world());
    std::vector<float> losses;
    for (int64_t s = 1; s <= syncs; ++s) {
      losses.push_back(r.step(batch(cfg, s).data(), lr_at(s)));
      island.sync(1, 0, false);
    }
    EXPECT_EQ(close(losses, want, 1e-5, 0, "loss"), "");
    EXPECT_EQ(island.moves().syncs, syncs);
    EXPECT_EQ(island.moves().gathered, 4) << "syncs 0, 2, 3, 5 read the parameters";
    EXPECT_EQ(island.moves().broadcast, 2) << "syncs 2 and 5 changed them";
    std::lock_guard<std::mutex> lock(mu);
    if (script) seen = script->seen;
    return 0;
  });
  ASSERT_EQ(seen.size(), want_seen.size());
  for (size_t i = 0; i < seen.size(); ++i)
    EXPECT_NEAR(seen[i], want_seen[i], 1e-4 * std::abs(want_seen[i]) + 1e-3);
}

// The named case in bf16, and the same with one more --set: a pass on and off.
std::pair<Config, Config> bf16_with_and_without(const char* name, const std::string& off_set) {
  Case on;
  for (const Case& c : cases())
    if (c.name == name) on = c;
  on.sets.push_back("model.dtype=bf16");
  Case off = on;
  off.sets.push_back(off_set);
  return {config(on), config(off)};
}

// Both trained on their ranks: every loss, gradient norm and parameter bit the same.
void expect_same_bits(const Config& a, const Config& b) {
  const TrainRun x = trained_on_ranks(a), y = trained_on_ranks(b);
  EXPECT_EQ(x.losses, y.losses);
  EXPECT_EQ(x.grad_norms, y.grad_norms);
  for (const auto& [param, v] : x.params) EXPECT_EQ(v, y.params.at(param)) << param;
}

// [passes] cast_before_gather (passes/gather_cast.cc) casts each rank's block before the
// all-gather instead of the gathered copy after it: in bf16 the parameters' all-gathers carry half
// the bytes, and every loss, gradient norm and parameter bit is that of the gathered-then-cast run.
TEST(GatherCast, HalvesGatheredBytesAndChangesNoBit) {
  for (const char* name : {"fsdp", "gpt2_fsdp", "mid_fsdp_megatron_2x2", "fsdp_gathered_once"}) {
    SCOPED_TRACE(name);
    const auto [a, b] = bf16_with_and_without(name, "passes.cast_before_gather=false");
    auto gathered = [](const Config& cfg) {
      const int64_t ranks = cfg.plan.plan.mesh.size();
      const CompiledStep s = compile_step(cfg, passes::StepKind::train, true, ranks);
      double f32 = 0, bf16 = 0;
      const ir::Graph& g = s.c.rank.graph;
      for (const ir::Node& n : g.nodes())
        if (n.op == ir::Op::all_gather) {
          const ir::TensorType& t = g.value(n.outputs[0]).type;
          (t.dtype == DType::bf16 ? bf16 : f32) += double(numel(t.shape) * dtype_size(t.dtype));
        }
      return std::pair{f32, bf16};
    };
    const auto [on_f32, on_bf16] = gathered(a);
    const auto [off_f32, off_bf16] = gathered(b);
    EXPECT_EQ(off_bf16, 0);
    EXPECT_GT(on_bf16, 0);
    // the matmul weights move in bf16 (half), what is read in f32 (norms, the embedding) as before
    EXPECT_LT(on_f32 + on_bf16, 0.6 * off_f32);
    expect_same_bits(a, b);
  }
}

// [passes] recast = false (passes/recast.cc) keeps each weight's forward cast for the backward
// instead of casting again: fewer casts, and every loss, gradient norm and parameter bit that of
// the recast run, on one rank and under fsdp.
TEST(Recast, KeptCastsChangeNoBit) {
  for (const char* name : {"fsdp", "gpt2_fsdp"}) {
    SCOPED_TRACE(name);
    const auto [a, b] = bf16_with_and_without(name, "passes.recast=false");
    auto casts = [](const Config& cfg) {
      const CompiledStep s = compiled(cfg);
      int n = 0;
      for (const ir::Node& node : s.c.rank.graph.nodes()) n += node.op == ir::Op::cast;
      return n;
    };
    EXPECT_LT(casts(b), casts(a));
    expect_same_bits(a, b);
  }
}

// [passes] reduce_dtype = "bf16" (passes/reduce_cast.cc): every gradient reduction of fsdp, data
// parallelism and fsdp x megatron runs in bf16, so their bytes are exactly half of f32's, while the
// parameters' gathers and the activations' reductions are as before; training stays within bf16's
// reach of the f32 reductions: each gradient rounded to 8 bits of mantissa moves the 20 steps'
// losses by up to 9e-5 (tiny) and 3.4e-3 (mid) relative, and the parameters by up to 4.7% in
// norm (mid: AdamW's near-sign update flips where a gradient is near zero); the bounds are 1% and
// 10%, which a misread buffer (bf16 bits taken for f32) breaks at once; the byte counts catch a
// reduction left in f32 or left out.
TEST(ReduceCast, HalvesTheGradientReductionsInBf16) {
  for (const char* name : {"fsdp", "data", "mid_fsdp_megatron_2x2", "fsdp_accum"}) {
    SCOPED_TRACE(name);
    const auto [f32, bf16] = bf16_with_and_without(name, "passes.reduce_dtype=bf16");
    auto bytes = [](const Config& cfg) {
      const CompiledStep s = compiled(cfg);
      const ir::Graph& g = s.c.rank.graph;
      // the reductions over the data axis (the gradients', bucketed, and the loss's scalar) by
      // dtype; every other collective's bytes
      std::map<std::string, double> b;
      for (const ir::Node& n : g.nodes()) {
        if (!ops::has_trait(n.op, ops::Trait::collective)) continue;
        const ir::Value& in = g.value(n.inputs[0]);
        const bool reduces = n.op == ir::Op::reduce_scatter || n.op == ir::Op::all_reduce;
        b[reduces && n.attr_str("axis") == "data"
              ? fmt::format("data {}", dtype_name(in.type.dtype))
              : "other"] += double(numel(in.type.shape) * dtype_size(in.type.dtype));
      }
      return b;
    };
    auto x = bytes(f32), y = bytes(bf16);
    // the reductions are waited for as late in bf16 as in f32 (the cast back comes before the
    // result's first reader, not at once): nodes between each prefetched reduction and its wait
    auto slack = [](const Config& cfg) {
      const CompiledStep s = compiled(cfg);
      const ir::Graph& g = s.c.rank.graph;
      int64_t nodes = 0;
      for (const ir::Node& n : g.nodes())
        if (ops::has_trait(n.op, ops::Trait::completion)) {
          const ir::Node& start = g.node(g.value(n.inputs[0]).producer);
          if (start.op == ir::Op::reduce_scatter || start.op == ir::Op::all_reduce)
            nodes += n.id - start.id;
        }
      return nodes;
    };
    EXPECT_GE(slack(bf16), slack(f32) / 2);
    EXPECT_EQ(x["data bf16"], 0);
    EXPECT_GT(y["data bf16"], 1000);
    // what stays f32 is the loss's scalars: a few bytes
    EXPECT_LT(y["data f32"], 64) << "a gradient reduced in f32 under reduce_dtype = bf16";
    EXPECT_EQ(y["data bf16"], (x["data f32"] - y["data f32"]) / 2);
    EXPECT_EQ(y["other"], x["other"]);
    const TrainRun a = trained_on_ranks(f32), b = trained_on_ranks(bf16);
    EXPECT_EQ(close(b.losses, a.losses, 1e-2, 0, "loss"), "");
    EXPECT_NE(a.losses, b.losses) << "the bf16 reductions changed nothing";
    for (const auto& [param, v] : a.params)
      EXPECT_EQ(close_norm(b.params.at(param), v, 0.1, "param " + param), "");
  }
}

// [passes] activation_reduce_dtype = "bf16" (passes/reduce_cast.cc): under megatron, with and
// without sequence parallelism, tensor parallelism's reductions of partial matmul products over the
// model axis (the row-parallel outputs attn_out and mlp_out in the forward, the column-parallel
// input gradients in the backward) run in bf16, at exactly half their f32 bytes; the gradients'
// reductions and every other collective are as before; the first step's loss is the f32
// reductions' within the forward's rounding (which a misread buffer breaks at once), and training
// stays within bf16's reach of them.
TEST(ReduceCast, HalvesTensorParallelismsPartialProductsInBf16) {
  for (const char* name : {"megatron", "megatron_sequence", "mid_megatron_sequence"}) {
    SCOPED_TRACE(name);
    const auto [f32, bf16] = bf16_with_and_without(name, "passes.activation_reduce_dtype=bf16");
    struct Bytes {
      std::map<std::string, double> by;           // "model f32", "model bf16", "other"
      int64_t outputs_f32 = 0, outputs_bf16 = 0;  // the forward's row-parallel outputs' reductions
    };
    auto bytes = [](const Config& cfg) {
      const CompiledStep s = compiled(cfg);
      const ir::Graph& g = s.c.rank.graph;
      Bytes r;
      for (const ir::Node& n : g.nodes()) {
        if (!ops::has_trait(n.op, ops::Trait::collective)) continue;
        const ir::Value& in = g.value(n.inputs[0]);
        const bool reduces = n.op == ir::Op::reduce_scatter || n.op == ir::Op::all_reduce;
        r.by[reduces && n.attr_str("axis") == "model"
                 ? fmt::format("model {}", dtype_name(in.type.dtype))
                 : "other"] += double(numel(in.type.shape) * dtype_size(in.type.dtype));
        // attn_out, or its bf16 copy attn_out.<reduction>.bf16_in; under megatron alone the
        // partial residual stream that holds them
        const std::string& v = in.name;
        bool output = false;
        for (const char* s : {"attn_out", "mlp_out", "resid_attn", "resid_mlp"})
          output |= reduces && v.find(s) != std::string::npos;
        (in.type.dtype == DType::bf16 ? r.outputs_bf16 : r.outputs_f32) += output;
      }
      return r;
    };
    const Bytes x = bytes(f32), y = bytes(bf16);
    EXPECT_EQ(x.outputs_bf16, 0);
    EXPECT_GT(x.outputs_f32, 0);
    EXPECT_EQ(y.outputs_f32, 0) << "a row-parallel output reduced in f32";
    EXPECT_EQ(y.outputs_bf16, x.outputs_f32);
    EXPECT_EQ(x.by.count("model bf16"), 0u);
    // the backward's input gradients are narrowed as well: more than the forward's outputs
    EXPECT_GT(y.by.at("model bf16"), 0);
    EXPECT_EQ(y.by.at("model bf16"), (x.by.at("model f32") - y.by.at("model f32")) / 2);
    EXPECT_EQ(y.by.at("other"), x.by.at("other"));
    const TrainRun a = trained_on_ranks(f32), b = trained_on_ranks(bf16);
    ASSERT_FALSE(a.losses.empty());
    // the first step's loss: the forward's rounding alone (measured within 9e-6)
    EXPECT_EQ(close({b.losses[0]}, {a.losses[0]}, 1e-4, 0, "first loss"), "");
    // then training's own amplification: within 2.5e-4 over 20 steps (tiny), 8.0e-3 (mid, a
    // loss spike at step 18); the parameters within 2.7% (tiny) and 11.2% (mid) in norm
    EXPECT_EQ(close(b.losses, a.losses, 2e-2, 0, "loss"), "");
    EXPECT_NE(a.losses, b.losses) << "the bf16 reductions changed nothing";
    for (const auto& [param, v] : a.params)
      EXPECT_EQ(close_norm(b.params.at(param), v, 0.25, "param " + param), "");
  }
}

// [passes] synthesize: the data-parallel gradients' all-reduces over {data = 4} on two hosts of
// two ranks become P2's hierarchical programs over sub-groups (a reduce-scatter within the host,
// an all-reduce across on the piece, an all-gather within), and the cases above
// (data4_synthesized) match one rank with them.
TEST(Synthesize, ReplacesFlatAllReducesWithSubGroupPrograms) {
  Case on;
  for (const Case& c : cases())
    if (c.name == "data4_synthesized") on = c;
  Case off = on;
  off.sets.push_back("passes.synthesize=false");
  auto collectives = [](const Config& cfg) {
    const CompiledStep s = compile_step(cfg, passes::StepKind::train, true, 4);
    std::map<std::string, int> n;
    for (const ir::Node& x : s.c.rank.graph.nodes())
      if (ops::has_trait(x.op, ops::Trait::collective))
        ++n[fmt::format("{} {}", x.op, x.attr_str("axis"))];
    return n;
  };
  const auto a = collectives(config(on)), b = collectives(config(off));
  EXPECT_GT(b.at("all_reduce data"), 0);
  EXPECT_EQ(a.count("all_reduce data"), 0u) << "a flat all-reduce left";
  EXPECT_GT(a.at("reduce_scatter data[1:2]"), 0);
  EXPECT_EQ(a.at("reduce_scatter data[1:2]"), a.at("all_gather data[1:2]"));
  // every reduction crosses the hosts once, on a piece where it was scattered (a scalar, which
  // cannot be, is summed in the host first)
  EXPECT_GE(a.at("all_reduce data[2:2]"), a.at("reduce_scatter data[1:2]"));
}

INSTANTIATE_TEST_SUITE_P(Tactics, PlanParity, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace loom::train::parity
