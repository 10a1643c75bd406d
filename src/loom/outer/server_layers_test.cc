// The outer sync service over a model with layers, in one process: streaming DiLoCo's fragments
// pushed, awaited and pulled on their own, and DiPaCo's paths pushed and pulled under the model's
// names.
#include <gtest/gtest.h>

#include "loom/core/error.h"
#include "loom/outer/fragments.h"
#include "loom/outer/server_testing.h"
#include "loom/outer/testing.h"

namespace loom::outer {
namespace {

using grpc::StatusCode;
using namespace test;

// Streaming DiLoCo over the wire: a push, an await and a pull name a fragment and move its tensors
// only; a fragment the server does not have, or a push with another fragment's tensors, is refused
// with nothing changed; a restarted server resumes every fragment's version.
TEST(OuterServer, FragmentsArePushedAwaitedAndPulledOnTheirOwn) {
  TempDir dir;
  Harness h;  // restarted below with the layered model and two fragments
  h.init = test::random_like(
      {{"layers.0.w", {3, 4}, {}, 0}, {"layers.1.w", {2, 2}, {}, 1}, {"head", {5}, {}}}, 1);
  h.cfg.fragments = 2;
  h.cfg.state_dir = dir.path;
  h.server.reset();
  h.start();
  auto a = h.client(), b = h.client();
  proto::JoinReply jr;
  grpc::Status s = a->join("one fragment", &jr);  // the island says 1
  EXPECT_EQ(s.error_code(), StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(s.error_message(),
            "the island splits the model into 1 fragment(s), the server into 2: set the same "
            "[outer] fragments");
  ASSERT_TRUE(a->join("a", &jr, "", 2).ok());
  EXPECT_EQ(jr.fragments(), 2u);
  const uint64_t ia = jr.island_id();
  ASSERT_TRUE(b->join("b", &jr, "", 2).ok());
  const uint64_t ib = jr.island_id();
  const std::vector<size_t> f0 = {0}, f1 = {1, 2};  // the head goes to the lighter fragment 1
  auto push_f = [&](OuterClient& cl, uint64_t id, uint32_t f, uint64_t base, const TensorList& g) {
    proto::PushHeader hd = header(id, base);
    hd.set_fragment(f);
    proto::PushReply r;
    return cl.push(hd, g, proto::F32, &r);
  };
  const TensorList g = test::random_like(h.init, 2);
  // garbage: a fragment out of range, the other fragment's tensors
  s = push_f(*a, ia, 2, 0, gather(g, f1));
  EXPECT_EQ(s.error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "push header: fragment 2, but the server's model has 2");
  s = push_f(*a, ia, 0, 0, gather(g, f1));
  EXPECT_EQ(s.error_code(), StatusCode::INVALID_ARGUMENT) << s.error_message();
  const uint64_t sent = a->bytes_sent();
  ASSERT_TRUE(push_f(*a, ia, 1, 0, gather(g, f1)).ok());
  EXPECT_EQ(a->bytes_sent() - sent, 9u * 4);  // fragment 1: 4 + 5 elements
  ASSERT_TRUE(push_f(*b, ib, 1, 0, gather(g, f1)).ok());
  EXPECT_EQ(h.server->version(), 1u);
  proto::AwaitReply aw;
  ASSERT_TRUE(a->await(ia, 1, 0, 0, &aw).ok());
  EXPECT_EQ(aw.state(), proto::AwaitReply::CLOSED);
  EXPECT_EQ(aw.version(), 1u);
  ASSERT_TRUE(a->await(ia, 0, 0, 0, &aw).ok());
  EXPECT_EQ(aw.state(), proto::AwaitReply::RESEND);  // a holds no push of fragment 0's round
  EXPECT_EQ(a->await(ia, 7, 0, 0, &aw).error_code(), StatusCode::INVALID_ARGUMENT);
  TensorList got0 = zeros_like(gather(h.init, f0)), got1 = zeros_like(gather(h.init, f1));
  uint64_t v = 9;
  const uint64_t received = a->bytes_received();
  ASSERT_TRUE(a->pull(ia, 0, got0, &v).ok());
  EXPECT_EQ(v, 0u);
  expect_same(got0, gather(h.init, f0));  // untouched by fragment 1's round
  ASSERT_TRUE(a->pull(ia, 1, got1, &v).ok());
  EXPECT_EQ(v, 1u);
  EXPECT_EQ(a->bytes_received() - received, 21u * 4);
  TensorList want = gather(h.init, f1), m = zeros_like(want);
  nesterov_step(h.cfg.opt, want, m, gather(g, f1));
  expect_same(got1, want, 1e-6f);
  EXPECT_EQ(a->pull(ia, 2, got1, &v).error_code(), StatusCode::INVALID_ARGUMENT);
  // a restart resumes both fragments' versions
  h.server.reset();
  h.start();
  EXPECT_EQ(h.server->version(), 1u);
  ASSERT_TRUE(a->await(ia, 1, 0, 0, &aw).ok());
  EXPECT_EQ(aw.state(), proto::AwaitReply::CLOSED);
  ASSERT_TRUE(push_f(*a, ia, 0, 0, gather(g, f0)).ok());
  ASSERT_TRUE(push_f(*b, ib, 0, 0, gather(g, f0)).ok());
  EXPECT_EQ(h.server->version(), 2u);
}

// DiPaCo over the wire: a join says its paths and path (another number of paths, or a path out of
// range, is refused); each island pushes and pulls its path under the model's names; a module is
// averaged over the paths through it that pushed; garbage pushes change nothing; the members' paths
// survive a restart; the global parameters a dense reader asks for are refused by name.
TEST(OuterServer, DiPaCoPathsArePushedAndPulledUnderTheModelsNames) {
  TempDir dir;
  Harness h;  // restarted below with the layered model and 2 x 2 modules
  h.init = test::random_like(
      {{"layers.0.w", {3, 4}, {}, 0}, {"layers.1.w", {2, 2}, {}, 1}, {"head", {5}, {}}}, 1);
  h.cfg.modules = {2, 2};
  h.cfg.opt = {1.0, 0.0};  // p - mean: each module moves by its paths' mean
  h.cfg.state_dir = dir.path;
  h.server.reset();
  h.start();
  auto a = h.client(), b = h.client(), c = h.client();
  proto::JoinReply jr;
  grpc::Status s = a->join("plain", &jr);  // an island without modules
  EXPECT_EQ(s.error_code(), StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(s.error_message(),
            "the island's [outer] modules make 0 path(s), the server's 4: set the same [outer] "
            "modules (none: not DiPaCo)");
  s = a->join("path 4", &jr, "", 1, 4, 4);
  EXPECT_EQ(s.error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "the island trains path 4, but the server's model has 4 path(s)");
  // paths 0 (modules 0.0), 1 (0.1) and 3 (1.1)
  ASSERT_TRUE(a->join("a", &jr, "", 1, 4, 0).ok());
  EXPECT_EQ(jr.paths(), 4u);
  const uint64_t ia = jr.island_id();
  ASSERT_TRUE(b->join("b", &jr, "", 1, 4, 1).ok());
  const uint64_t ib = jr.island_id();
  ASSERT_TRUE(c->join("c", &jr, "c-key", 1, 4, 3).ok());
  const uint64_t ic = jr.island_id();
  auto filled = [&](float v) {
    TensorList t = zeros_like(h.init);
    for (auto& x : t) std::fill(x.data.begin(), x.data.end(), v);
    return t;
  };
  // garbage: a push short of a tensor, one with a non-finite value: refused, nothing summed
  TensorList shortg = filled(1);
  shortg.pop_back();
  proto::PushReply r;
  EXPECT_EQ(c->push(header(ic, 0), shortg, proto::F32, &r).error_code(),
            StatusCode::INVALID_ARGUMENT);
  TensorList nan = filled(1);
  nan[1].data[2] = std::nanf("");
  EXPECT_EQ(c->push(header(ic, 0), nan, proto::F32, &r).error_code(), StatusCode::INVALID_ARGUMENT);
  ASSERT_TRUE(push(*a, ia, 0, filled(1)).ok());
  ASSERT_TRUE(push(*b, ib, 0, filled(2)).ok());
  EXPECT_EQ(h.server->version(), 0u);
  ASSERT_TRUE(push(*c, ic, 0, filled(4)).ok());
  EXPECT_EQ(h.server->version(), 1u);
  // level 0 (layers.0): module 0 on paths 0, 1 (mean 1.5), module 1 on path 3 (4); level 1
  // (layers.1, head): module 0 on path 0 (1), module 1 on paths 1, 3 (3)
  auto pulled = [&](OuterClient& cl, uint64_t id) {
    TensorList got = zeros_like(h.init);
    uint64_t v = 9;
    grpc::Status st = cl.pull(id, 0, got, &v);
    EXPECT_TRUE(st.ok()) << st.error_message();
    EXPECT_EQ(v, 1u);
    return got;
  };
  auto expect_moved = [&](const TensorList& got, float level0, float level1) {
    for (size_t k = 0; k < got.size(); ++k)
      for (size_t i = 0; i < got[k].data.size(); ++i)
        EXPECT_FLOAT_EQ(got[k].data[i], h.init[k].data[i] - (k == 0 ? level0 : level1))
            << got[k].name;
  };
  expect_moved(pulled(*a, ia), 1.5f, 1.f);
  expect_moved(pulled(*b, ib), 1.5f, 3.f);
  expect_moved(pulled(*c, ic), 4.f, 3.f);
  const uint64_t received = a->bytes_received();
  pulled(*a, ia);
  EXPECT_EQ(a->bytes_received() - received, 21u * 4) << "a path is the model's size";
  // the server's parameters are the module table: 2 x 12 + 2 x 9 elements
  int64_t n = 0;
  for (const auto& t : h.server->params()) n += numel(t.shape);
  EXPECT_EQ(n, 2 * 12 + 2 * 9);
  // a restart keeps every member's path: c (rejoining under its key) still pulls path 3
  h.server.reset();
  h.start();
  ASSERT_TRUE(c->join("c again", &jr, "c-key", 1, 4, 3).ok());
  EXPECT_EQ(jr.island_id(), ic);
  expect_moved(pulled(*c, ic), 4.f, 3.f);
  expect_moved(pulled(*b, ib), 1.5f, 3.f);
}

// Quantised updates: with int4 pushes the server commits each update as its int4 encoding decodes,
// and an island one version behind pulls that update (7x fewer bytes) and lands on the server's
// parameters bit for bit; an island further behind, or one that does not ask, pulls them whole.

}  // namespace
}  // namespace loom::outer
