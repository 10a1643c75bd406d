// The outer sync service's request decoder: what a hostile island can send it. The service
// (outer/service.h) is driven as the gRPC server drives it, without the network: the input is a
// sequence of calls, each decoded from its protobuf bytes and handed to the service.
//
// Input: byte 0 picks the mode (bit 0: async), an outer learning rate (bits 1-3) and, in sync mode,
// streaming fragments (bit 4: two, the model's tensors named "layers.0.a" and "layers.1.b") and
// int4 updates for pulls (bit 5), or DiPaCo (bit 6 without bits 4 and 5: modules [1, 2], the
// tensors named as with fragments); then records
// of [kind: 1 byte][n: 2 bytes little-endian][n bytes]. kind % 6: 0 Join, 1 Heartbeat, 2 Push,
// 3 Await (its wait_ms is taken as 0: no sleeping), 4 Leave, 5 Pull; the n bytes are the request's
// protobuf encoding, except for Push, whose bytes are the stream's messages, each as [m: 2 bytes
// little-endian][m bytes of a PushRequest]. A request that does not decode is refused as gRPC
// refuses it (the call never reaches the service); a stream message that does not decode ends
// the stream. The server's model: "a" f32[3] and "b" f32[2,2] (as above with fragments).
#include <google/protobuf/stubs/logging.h>

#include "fuzz/fuzz.h"
#include "loom/core/file.h"
#include "loom/outer/service.h"

namespace {

using namespace loom::outer;

struct Reader {
  const uint8_t* p;
  size_t n;
  bool take(size_t k, std::string_view* out) {
    if (k > n) return false;
    *out = {reinterpret_cast<const char*>(p), k};
    p += k, n -= k;
    return true;
  }
  bool u8(uint8_t* v) {
    std::string_view s;
    if (!take(1, &s)) return false;
    *v = uint8_t(s[0]);
    return true;
  }
  bool u16(size_t* v) {
    std::string_view s;
    if (!take(2, &s)) return false;
    *v = size_t(uint8_t(s[0])) | size_t(uint8_t(s[1])) << 8;
    return true;
  }
};

template <class M>
bool decode(std::string_view bytes, M* m) {
  return m->ParseFromArray(bytes.data(), int(bytes.size()));
}

// A unary call: the request decoded from `body` (a request that does not decode never reaches the
// service, as with gRPC), `edit` applied to it, then the service's `call` with a reply.
template <class Req, class Rep, class Edit = void (*)(Req&)>
void unary(
    OuterService& svc, std::string_view body, grpc::Status (OuterService::*call)(const Req&, Rep*),
    Edit edit = [](Req&) {}) {
  Req q;
  Rep r;
  if (!decode(body, &q)) return;
  edit(q);
  (void)(svc.*call)(q, &r);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // protobuf logs every string field that is not UTF-8 as it refuses it: millions of lines here
  static const bool quiet = (google::protobuf::SetLogHandler(nullptr), true);
  (void)quiet;
  Reader in{data, size};
  uint8_t head;
  if (!in.u8(&head)) return 0;
  ServerConfig cfg;
  cfg.mode = head & 1 ? loom::outer::OuterMode::async : loom::outer::OuterMode::sync;
  cfg.opt.lr = 0.25 * double(1 + ((head >> 1) & 7));  // up to 2: updates that can overflow
  cfg.inner_steps = 4;
  cfg.step_budget = 64;
  cfg.token = "t";
  cfg.verbose = false;
  const bool fragments = !(head & 1) && (head & 16);
  const bool dipaco = !(head & 1) && !(head & 48) && (head & 64);
  cfg.fragments = fragments ? 2 : 1;
  if (dipaco) cfg.modules = {1, 2};
  cfg.update_encoding = head & 32 ? proto::INT4 : proto::F32;
  const bool layered = fragments || dipaco;
  TensorList model{{layered ? "layers.0.a" : "a", {3}, std::vector<float>(3, 0.5f)},
                   {layered ? "layers.1.b" : "b", {2, 2}, std::vector<float>(4, -1.0f)}};
  loom::fuzz::guard([&] {
    OuterService svc(cfg, model);
    for (int calls = 0; calls < 64; ++calls) {
      uint8_t kind;
      size_t n;
      std::string_view body;
      if (!in.u8(&kind) || !in.u16(&n) || !in.take(n, &body)) break;
      switch (kind % 6) {
        case 0:
          unary(svc, body, &OuterService::join);
          break;
        case 1:
          unary(svc, body, &OuterService::heartbeat);
          break;
        case 2: {
          Reader stream{reinterpret_cast<const uint8_t*>(body.data()), body.size()};
          proto::PushReply r;
          (void)svc.push(
              [&](proto::PushRequest& m) {
                size_t k;
                std::string_view msg;
                m.Clear();
                return stream.u16(&k) && stream.take(k, &msg) && decode(msg, &m);
              },
              &r);
          break;
        }
        case 3:
          unary(svc, body, &OuterService::await, [](proto::AwaitRequest& q) { q.set_wait_ms(0); });
          break;
        case 4:
          unary(svc, body, &OuterService::leave);
          break;
        case 5: {
          proto::PullRequest q;
          if (decode(body, &q)) {
            int writes = 0;
            (void)svc.pull(q, [&](const proto::PullReply&) { return ++writes < 3; });
          }
          break;
        }
      }
    }
    // whatever was accepted, the parameters stay finite (the server never commits otherwise)
    for (const Tensor& t : svc.params())
      if (loom::first_nonfinite(t.data.data(), int64_t(t.data.size())) >= 0) std::abort();
  });
  return 0;
}
