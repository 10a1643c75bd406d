// The outer sync service in one process: a server on loopback and clients speaking to it over gRPC.
// Rounds, the outer step, rejections (token, stale, shapes, garbage) leaving the state untouched,
// lease expiry, joining mid-round, restart from the state file, async mode, TLS.
#include "loom/outer/server.h"

#include <fmt/format.h>
#include <grpcpp/generic/generic_stub.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <random>
#include <thread>

#include "loom/core/error.h"
#include "loom/outer/client.h"
#include "loom/outer/server_testing.h"
#include "loom/outer/testing.h"

namespace loom::outer {
namespace {

namespace fs = std::filesystem;
using grpc::StatusCode;

using test::await;
using test::expect_same;
using test::Harness;
using test::header;
using test::join;
using test::model;
using test::push;
using test::TempDir;

TEST(OuterServer, SyncRoundTakesTheNesterovStepOnTheMean) {
  Harness h;
  auto a = h.client(), b = h.client();
  uint64_t ia = join(*a), ib = join(*b);
  TensorList got = zeros_like(h.init);
  uint64_t v = 99;
  ASSERT_TRUE(a->pull(ia, 0, got, &v).ok());
  EXPECT_EQ(v, 0u);
  expect_same(got, h.init);

  TensorList g1 = model(2), g2 = model(3);
  ASSERT_TRUE(push(*a, ia, 0, g1).ok());
  EXPECT_EQ(await(*a, ia, 0), proto::AwaitReply::PENDING);
  EXPECT_EQ(h.server->version(), 0u);
  ASSERT_TRUE(push(*b, ib, 0, g2).ok());
  EXPECT_EQ(h.server->version(), 1u);
  EXPECT_EQ(await(*a, ia, 0), proto::AwaitReply::CLOSED);

  TensorList want = h.init, m = zeros_like(h.init), mean = zeros_like(h.init);
  for (size_t t = 0; t < mean.size(); ++t)
    for (size_t i = 0; i < mean[t].data.size(); ++i)
      mean[t].data[i] = (g1[t].data[i] + g2[t].data[i]) * 0.5f;
  nesterov_step(h.cfg.opt, want, m, mean);
  ASSERT_TRUE(b->pull(ib, 0, got, &v).ok());
  EXPECT_EQ(v, 1u);
  expect_same(got, want, 1e-6f);
  EXPECT_EQ(a->bytes_sent(), uint64_t(total_elements(h.init)) * 4);
  EXPECT_EQ(b->bytes_received(), uint64_t(total_elements(h.init)) * 4);  // one pull each
  EXPECT_EQ(a->bytes_received(), uint64_t(total_elements(h.init)) * 4);
}

// Sends `bytes` as the request of `method` without any encoding: what a broken or hostile peer
// does.
grpc::Status raw_call(const std::string& addr, const std::string& method, const std::string& bytes,
                      const std::string& token = "secret") {
  auto ch = grpc::CreateChannel(addr, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(ch);
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Bearer " + token);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::Slice slice(bytes);
  grpc::ByteBuffer req(&slice, 1), resp;
  grpc::CompletionQueue cq;
  auto call = stub.PrepareUnaryCall(&ctx, method, req, &cq);
  call->StartCall();
  grpc::Status st;
  call->Finish(&resp, &st, reinterpret_cast<void*>(1));
  void* tag;
  bool ok;
  cq.Next(&tag, &ok);
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return st;
}

// A push of the given chunks, encoded by nobody's rules: what a broken or hostile island sends.
grpc::Status raw_push(const std::string& addr, const proto::PushHeader& h,
                      const std::vector<proto::TensorChunk>& chunks) {
  auto stub =
      proto::OuterSync::NewStub(grpc::CreateChannel(addr, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Bearer secret");
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  proto::PushReply rep;
  auto w = stub->Push(&ctx, &rep);
  proto::PushRequest m;
  *m.mutable_header() = h;
  bool ok = w->Write(m);
  m.clear_header();
  for (size_t i = 0; ok && i < chunks.size(); ++i) {
    *m.mutable_chunk() = chunks[i];
    ok = w->Write(m);
  }
  w->WritesDone();
  return w->Finish();
}

TEST(OuterServer, RejectsBadCallsAndKeepsServingWithItsStateUntouched) {
  Harness h;
  auto a = h.client(), b = h.client();
  uint64_t ia = join(*a), ib = join(*b);
  ASSERT_TRUE(push(*a, ia, 0, model(2)).ok());
  ASSERT_TRUE(push(*b, ib, 0, model(3)).ok());
  ASSERT_EQ(h.server->version(), 1u);
  ASSERT_TRUE(push(*a, ia, 1, model(4)).ok());  // a push held for round 2
  const TensorList before = h.server->params();
  const int64_t pushes = h.server->pushes();

  // a wrong token: refused, and the client says so
  auto stranger = h.client("guess");
  proto::JoinReply jr;
  try {
    stranger->join("x", &jr);
    ADD_FAILURE() << "a wrong token was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("refused the token"), std::string::npos) << e.what();
  }
  EXPECT_EQ(raw_call(h.addr(), "/loom.outer.proto.OuterSync/Heartbeat", "", "guess").error_code(),
            StatusCode::UNAUTHENTICATED);

  // stale, future, duplicate, unknown island
  grpc::Status s = push(*b, ib, 0, model(5));
  EXPECT_EQ(s.error_code(), StatusCode::FAILED_PRECONDITION) << s.error_message();
  EXPECT_NE(s.error_message().find("stale push"), std::string::npos);
  s = push(*b, ib, 7, model(5));
  EXPECT_EQ(s.error_code(), StatusCode::INVALID_ARGUMENT) << s.error_message();
  s = push(*a, ia, 1, model(5));
  EXPECT_EQ(s.error_code(), StatusCode::ALREADY_EXISTS) << s.error_message();
  s = push(*a, 12345, 1, model(5));
  EXPECT_EQ(s.error_code(), StatusCode::NOT_FOUND) << s.error_message();

  // wrong names and shapes, a non-finite value
  TensorList wrong = model(5);
  wrong[0].shape = {4, 3};
  wrong[0].name = "v";
  s = push(*b, ib, 1, wrong);
  EXPECT_EQ(s.error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("expected a chunk of tensor 'w', got 'v'"), std::string::npos)
      << s.error_message();
  TensorList shorter = model(5);
  shorter[1].data.resize(3);
  s = push(*b, ib, 1, shorter);
  EXPECT_EQ(s.error_code(), StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("tensor 'b' [5] incomplete: 3 of 5"), std::string::npos)
      << s.error_message();
  TensorList nan = model(5);
  nan[1].data[2] = std::numeric_limits<float>::infinity();
  s = push(*b, ib, 1, nan);
  EXPECT_NE(s.error_message().find("non-finite value at element 2"), std::string::npos);
  // a join with another model
  TensorList other = h.init;
  other[1].shape = {6};
  other[1].data.resize(6);
  auto c = h.client("secret", other);
  s = c->join("other", &jr);
  EXPECT_EQ(s.error_code(), StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("'b' [6] there, 'b' [5] here"), std::string::npos)
      << s.error_message();

  // quantised pushes whose chunks lie: a NaN scale, a scale that dequantises past f32 (inf), a
  // count past the tensor, data a byte short, a value byte where a scale belongs
  for (proto::Encoding enc : {proto::INT8, proto::INT4}) {
    std::vector<proto::TensorChunk> good;
    for_each_chunk(model(5), enc, [&](proto::TensorChunk& c) {
      good.push_back(c);
      return true;
    });
    ASSERT_EQ(good.size(), 2u);
    const float nan_scale = std::numeric_limits<float>::quiet_NaN(), huge = 3e38f;
    std::vector<std::pair<std::string, std::function<void(proto::TensorChunk&)>>> lies = {
        {"NaN scale",
         [&](proto::TensorChunk& c) {
           c.mutable_data()->replace(0, 4, (const char*)&nan_scale, 4);
         }},
        {"inf after scaling",
         [&](proto::TensorChunk& c) { c.mutable_data()->replace(0, 4, (const char*)&huge, 4); }},
        {"count past the tensor", [](proto::TensorChunk& c) { c.set_count(c.count() + 1); }},
        {"a byte short", [](proto::TensorChunk& c) { c.mutable_data()->pop_back(); }},
        {"no count", [](proto::TensorChunk& c) { c.set_count(0); }},
    };
    for (auto& [what, lie] : lies) {
      std::vector<proto::TensorChunk> bad = good;
      lie(bad[0]);
      s = raw_push(h.addr(), header(ib, 1), bad);
      EXPECT_EQ(s.error_code(), StatusCode::INVALID_ARGUMENT) << what << ": " << s.error_message();
    }
  }

  // garbage bytes to every method
  std::mt19937 rng(3);
  for (const char* m : {"Join", "Heartbeat", "Push", "Await", "Pull"}) {
    for (int k = 0; k < 20; ++k) {
      std::string bytes(1 + rng() % 200, '\0');
      for (char& x : bytes) x = char(rng());
      raw_call(h.addr(), std::string("/loom.outer.proto.OuterSync/") + m, bytes);  // any status
    }
  }

  EXPECT_EQ(h.server->version(), 1u);
  EXPECT_EQ(h.server->pushes(), pushes);
  expect_same(h.server->params(), before);
  // still serving: the round completes as if nothing happened
  ASSERT_TRUE(push(*b, ib, 1, model(6)).ok());
  EXPECT_EQ(h.server->version(), 2u);
}

// One push in flight per island: a second one while the first still streams is refused with
// RESOURCE_EXHAUSTED (each holds a model-sized buffer; 100 header-only pushes from one island made
// the server hold 100 models); once the first ends, the island pushes again.
TEST(OuterServer, AnIslandHoldsAtMostOnePushInFlight) {
  Harness h;
  auto a = h.client(), b = h.client();
  uint64_t ia = join(*a), ib = join(*b);
  auto ch = grpc::CreateChannel(h.addr(), grpc::InsecureChannelCredentials());
  auto stub = proto::OuterSync::NewStub(ch);
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Bearer secret");
  proto::PushReply held_reply;
  auto held = stub->Push(&ctx, &held_reply);
  proto::PushRequest first;
  *first.mutable_header() = header(ia, 0);
  ASSERT_TRUE(held->Write(first));
  // the server holds the push once it has read the held stream's header: probe until it has, with
  // header-only pushes (one that wins the race is refused as incomplete and changes nothing)
  grpc::Status s;
  for (int i = 0; i < 200; ++i) {
    grpc::ClientContext pctx;
    pctx.AddMetadata("authorization", "Bearer secret");
    proto::PushReply prep;
    auto probe = stub->Push(&pctx, &prep);
    probe->Write(first);
    probe->WritesDone();
    s = probe->Finish();
    if (s.error_code() == StatusCode::RESOURCE_EXHAUSTED) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(s.error_code(), StatusCode::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_NE(s.error_message().find("already has a push in flight"), std::string::npos)
      << s.error_message();
  EXPECT_TRUE(push(*b, ib, 0, model(3)).ok());  // another island is not held up
  held->WritesDone();
  const grpc::Status hs = held->Finish();  // header only: incomplete, refused
  EXPECT_EQ(hs.error_code(), StatusCode::INVALID_ARGUMENT) << hs.error_message();
  ASSERT_TRUE(push(*a, ia, 0, model(2)).ok());
  EXPECT_EQ(h.server->version(), 1u);
}

TEST(OuterServer, AnIslandWhoseLeaseExpiresIsDroppedAndTheRoundCloses) {
  ServerConfig c;
  c.lease_s = 0.3;
  Harness h(c);
  auto a = h.client(), b = h.client();
  uint64_t ia = join(*a), ib = join(*b);
  (void)ia;  // a goes silent
  ASSERT_TRUE(push(*b, ib, 0, model(2)).ok());
  auto t0 = std::chrono::steady_clock::now();
  proto::AwaitReply::State st = proto::AwaitReply::PENDING;
  while (st == proto::AwaitReply::PENDING &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10))
    st = await(*b, ib, 0, 200);  // each call renews b's lease
  EXPECT_EQ(st, proto::AwaitReply::CLOSED);
  EXPECT_EQ(h.server->version(), 1u);
  EXPECT_EQ(h.server->members(), 1u);
  // the dropped island learns it must join again
  proto::HeartbeatReply hr;
  EXPECT_EQ(a->heartbeat(ia, &hr).error_code(), StatusCode::NOT_FOUND);
}

TEST(OuterServer, AnIslandJoiningMidRoundIsExpectedFromTheNextRound) {
  Harness h;
  auto a = h.client(), b = h.client(), c = h.client();
  uint64_t ia = join(*a), ib = join(*b);
  ASSERT_TRUE(push(*a, ia, 0, model(2)).ok());
  ASSERT_TRUE(push(*b, ib, 0, model(3)).ok());
  ASSERT_EQ(h.server->version(), 1u);
  ASSERT_TRUE(push(*a, ia, 1, model(2)).ok());  // round 2 under way
  proto::JoinReply jr;
  ASSERT_TRUE(c->join("late", &jr).ok());
  uint64_t ic = jr.island_id();
  EXPECT_EQ(jr.version(), 1u);
  ASSERT_TRUE(push(*b, ib, 1, model(3)).ok());
  EXPECT_EQ(h.server->version(), 2u);  // closed without c
  ASSERT_TRUE(push(*a, ia, 2, model(4)).ok());
  ASSERT_TRUE(push(*b, ib, 2, model(5)).ok());
  EXPECT_EQ(h.server->version(), 2u);  // now c is expected
  EXPECT_EQ(push(*c, ic, 1, model(6)).error_code(), StatusCode::FAILED_PRECONDITION);  // stale
  ASSERT_TRUE(push(*c, ic, 2, model(6)).ok());
  EXPECT_EQ(h.server->version(), 3u);
}

TEST(OuterServer, TheFirstRoundWaitsForMinIslandsOrItsGrace) {
  ServerConfig cfg;
  cfg.min_islands = 3;
  cfg.start_grace_s = 0.4;
  Harness h(cfg);
  auto a = h.client(), b = h.client(), c = h.client();
  uint64_t ia = join(*a), ib = join(*b);
  ASSERT_TRUE(push(*a, ia, 0, model(2)).ok());
  ASSERT_TRUE(push(*b, ib, 0, model(3)).ok());
  EXPECT_EQ(h.server->version(), 0u);  // two of three
  uint64_t ic = join(*c);              // a late starter is still expected in round 1
  ASSERT_TRUE(push(*c, ic, 0, model(4)).ok());
  EXPECT_EQ(h.server->version(), 1u);

  Harness g(cfg);  // only two ever come: the round closes after the grace
  auto d = g.client(), e = g.client();
  uint64_t id = join(*d), ie = join(*e);
  ASSERT_TRUE(push(*d, id, 0, model(2)).ok());
  ASSERT_TRUE(push(*e, ie, 0, model(3)).ok());
  EXPECT_EQ(g.server->version(), 0u);
  EXPECT_EQ(await(*d, id, 0, 3000), proto::AwaitReply::CLOSED);
  EXPECT_EQ(g.server->version(), 1u);
}

TEST(OuterServer, AnIslandThatLeavesIsNotWaitedFor) {
  Harness h;
  auto a = h.client(), b = h.client();
  uint64_t ia = join(*a), ib = join(*b);
  ASSERT_TRUE(push(*a, ia, 0, model(2)).ok());
  EXPECT_EQ(h.server->version(), 0u);
  ASSERT_TRUE(b->leave(ib).ok());
  EXPECT_EQ(h.server->version(), 1u);
  EXPECT_EQ(h.server->members(), 1u);
  EXPECT_EQ(b->leave(ib).error_code(), StatusCode::NOT_FOUND);
}

TEST(OuterServer, ARestartedServerResumesItsStateAndAsksForLostPushes) {
  TempDir dir;
  ServerConfig c;
  c.state_dir = dir.path;
  Harness h(c);
  auto a = h.client(), b = h.client();
  uint64_t ia = join(*a), ib = join(*b);
  ASSERT_TRUE(push(*a, ia, 0, model(2)).ok());
  ASSERT_TRUE(push(*b, ib, 0, model(3)).ok());
  ASSERT_TRUE(push(*a, ia, 1, model(4)).ok());  // in flight when the server goes
  const TensorList after_round = h.server->params();
  h.server.reset();  // as after a crash, the file holds what the last round wrote
  uint64_t v = 0;
  expect_same(read_state_params(state_file(dir.path), &v), after_round);
  EXPECT_EQ(v, 1u);

  h.start();  // same port, same state dir
  EXPECT_EQ(h.server->version(), 1u);
  EXPECT_EQ(h.server->members(), 2u);
  expect_same(h.server->params(), after_round);
  EXPECT_EQ(await(*a, ia, 1), proto::AwaitReply::RESEND);
  ASSERT_TRUE(push(*a, ia, 1, model(4)).ok());
  ASSERT_TRUE(push(*b, ib, 1, model(5)).ok());
  EXPECT_EQ(h.server->version(), 2u);
}

TEST(OuterServer, AnIslandOneVersionBehindPullsTheQuantisedUpdate) {
  ServerConfig c;
  c.update_encoding = proto::INT4;
  Harness h(c);
  h.init = test::random_like({{"w", {300}, {}}, {"b", {77}, {}}}, 1);
  h.server.reset();
  h.start();
  auto a = h.client(), b = h.client();
  const uint64_t ia = join(*a), ib = join(*b);
  TensorList held = zeros_like(h.init);
  uint64_t v = 0;
  ASSERT_TRUE(a->pull(ia, 0, held, &v).ok());  // version 0, whole
  const TensorList g = test::random_like(h.init, 2);
  for (uint64_t round = 0; round < 2; ++round) {
    ASSERT_TRUE(push(*a, ia, round, g).ok());
    ASSERT_TRUE(push(*b, ib, round, g).ok());
  }
  ASSERT_EQ(h.server->version(), 2u);
  // a holds version 0: two behind, so the parameters come whole (f32)
  uint64_t before = a->bytes_received();
  TensorList whole = held;
  uint64_t vw = v;
  ASSERT_TRUE(a->pull(ia, 0, whole, &vw, true).ok());
  EXPECT_EQ(vw, 2u);
  EXPECT_EQ(a->bytes_received() - before, 377u * 4);
  expect_same(whole, h.server->params());
  // one more round: from version 2 the update comes int4, and lands bit for bit
  TensorList at2 = whole;
  ASSERT_TRUE(push(*a, ia, 2, g).ok());
  ASSERT_TRUE(push(*b, ib, 2, g).ok());
  before = a->bytes_received();
  ASSERT_TRUE(a->pull(ia, 0, whole, &vw, true).ok());
  EXPECT_EQ(vw, 3u);
  EXPECT_EQ(a->bytes_received() - before,
            quantized_bytes(proto::INT4, 300) + quantized_bytes(proto::INT4, 77));
  expect_same(whole, h.server->params());  // tolerance 0
  bool moved = false;                      // and the round moved them
  for (size_t t = 0; t < at2.size(); ++t)
    for (size_t i = 0; i < at2[t].data.size(); ++i)
      moved = moved || whole[t].data[i] != at2[t].data[i];
  EXPECT_TRUE(moved);
  // not asked for: whole
  TensorList plain = at2;
  uint64_t vp = 2;
  ASSERT_TRUE(b->pull(ib, 0, plain, &vp).ok());
  expect_same(plain, h.server->params());
}

TEST(OuterServer, AStateOfAnotherModelOrModeIsRefused) {
  TempDir dir;
  ServerConfig c;
  c.state_dir = dir.path;
  c.token = "t";
  c.verbose = false;
  {
    OuterServer s(c, model(1));
    s.start("127.0.0.1:0");
  }
  TensorList other = model(1);
  other[0].shape = {4, 3};
  try {
    OuterServer s(c, other);
    ADD_FAILURE() << "another model's state was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'param.w' is f32[3,4], the model's is f32[4,3]"),
              std::string::npos)
        << e.what();
  }
  c.mode = OuterMode::async;
  EXPECT_THROW(OuterServer(c, model(1)), Error);
}

TEST(OuterServer, AsyncAppliesEachPushAndGivesSlowIslandsFewerSteps) {
  ServerConfig c;
  c.mode = OuterMode::async;
  c.inner_steps = 12;
  c.delay = 2;
  c.step_budget = 72;
  Harness h(c);
  auto a = h.client(), b = h.client();
  uint64_t ia = join(*a), ib = join(*b);
  TensorList want = h.init, m = zeros_like(want), buf = zeros_like(want);
  int64_t count = 0;
  // (island, base version, seconds for 12 steps, H told, period): speeds are known from an
  // island's third push (the first round holds the warm-up); the slow island then gets a third of H
  struct Push {
    int island;
    uint64_t base;
    double seconds;
    uint32_t h;
    uint64_t period;
  };
  const Push pushes[] = {{0, 0, 1.2, 12, 1}, {1, 0, 3.6, 12, 1},  // stale by one: applied anyway
                         {0, 1, 1.2, 12, 2}, {1, 2, 3.6, 12, 2},
                         {0, 3, 1.2, 12, 3}, {1, 4, 3.6, 4, 3}};
  for (size_t k = 0; k < std::size(pushes); ++k) {
    const Push& p = pushes[k];
    proto::PushReply r;
    ASSERT_TRUE(push(p.island == 0 ? *a : *b, p.island == 0 ? ia : ib, p.base, model(2 + k), &r, 12,
                     p.seconds)
                    .ok());
    delayed_nesterov_push(c.opt, 2, want, m, buf, count, model(2 + k));
    EXPECT_EQ(r.version(), k + 1) << k;
    EXPECT_EQ(r.inner_steps(), p.h) << k;
    EXPECT_EQ(r.period(), p.period) << k;
    // an await for the push's period: closed at the period's second push (N = 2)
    proto::AwaitReply w;
    ASSERT_TRUE((p.island == 0 ? *a : *b)
                    .await(p.island == 0 ? ia : ib, 0, 0, 0, &w, nullptr, p.period)
                    .ok());
    EXPECT_EQ(w.state(), k % 2 == 1 ? proto::AwaitReply::CLOSED : proto::AwaitReply::PENDING) << k;
    EXPECT_EQ(r.done(), k + 1 == std::size(pushes)) << k;  // 72 inner steps pushed
  }
  expect_same(h.server->params(), want, 1e-6f);
}

TEST(OuterServer, ServesOverTlsAndRefusesPlaintext) {
  TempDir dir;
  const std::string key = dir.path + "/key.pem", cert = dir.path + "/cert.pem";
  std::string cmd =
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost "
      "-addext subjectAltName=IP:127.0.0.1,DNS:localhost -keyout " +
      key + " -out " + cert + " >/dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "openssl could not make a test certificate";
  ServerConfig c;
  c.tls_cert = cert;
  c.tls_key = key;
  Harness h(c);
  OuterClient tls(ClientConfig{h.addr(), "secret", cert, 2.0}, h.init);
  EXPECT_NE(join(tls), 0u);
  OuterClient plain(ClientConfig{h.addr(), "secret", "", 0.5}, h.init);
  proto::JoinReply r;
  EXPECT_THROW(plain.join("plain", &r), Error);
}

}  // namespace
}  // namespace loom::outer
