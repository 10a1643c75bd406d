// A server on loopback and the calls its tests make to it (server_test.cc,
// server_layers_test.cc).
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "loom/outer/client.h"
#include "loom/outer/server.h"
#include "loom/outer/testing.h"

namespace loom::outer::test {

struct Harness {
  ServerConfig cfg;
  TensorList init = model(1);
  std::unique_ptr<OuterServer> server;
  int port = 0;

  explicit Harness(ServerConfig c = {}) : cfg(std::move(c)) {
    cfg.token = "secret";
    cfg.verbose = false;
    start();
  }
  void start() {
    server = std::make_unique<OuterServer>(cfg, init);
    port = server->start(port ? fmt::format("127.0.0.1:{}", port) : "127.0.0.1:0");
  }
  std::string addr() const { return fmt::format("127.0.0.1:{}", port); }
  std::unique_ptr<OuterClient> client(std::string token = "secret", TensorList spec = {}) const {
    return std::make_unique<OuterClient>(ClientConfig{addr(), token, "", 2.0},
                                         spec.empty() ? init : spec);
  }
};

inline uint64_t join(OuterClient& c) {
  proto::JoinReply r;
  grpc::Status s = c.join("test", &r);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return r.island_id();
}

inline proto::PushHeader header(uint64_t id, uint64_t base, uint32_t steps = 5,
                                double seconds = 0.5) {
  proto::PushHeader h;
  h.set_island_id(id);
  h.set_base_version(base);
  h.set_inner_steps(steps);
  h.set_seconds(seconds);
  return h;
}

inline grpc::Status push(OuterClient& c, uint64_t id, uint64_t base, const TensorList& g,
                         proto::PushReply* rep = nullptr, uint32_t steps = 5,
                         double seconds = 0.5) {
  proto::PushReply r;
  return c.push(header(id, base, steps, seconds), g, proto::F32, rep ? rep : &r);
}

inline proto::AwaitReply::State await(OuterClient& c, uint64_t id, uint64_t base,
                                      uint32_t wait_ms = 0) {
  proto::AwaitReply a;
  grpc::Status s = c.await(id, 0, base, wait_ms, &a);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return a.state();
}

}  // namespace loom::outer::test
