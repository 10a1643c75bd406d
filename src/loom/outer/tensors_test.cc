// Chunking and the Assembler, the decoder of every tensor that comes off the network: round trips,
// each kind of bad chunk, and fuzzing with random and mutated requests.
#include "loom/outer/tensors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "loom/core/dtype.h"

namespace loom::outer {
namespace {

TensorList sample(int64_t big = 300000) {  // one tensor spans two chunks
  TensorList t{{"a", {2, 3}, {}}, {"b.weight", {big}, {}}, {"c", {1}, {}}};
  std::mt19937 rng(1);
  std::normal_distribution<float> n;
  for (auto& x : t) {
    x.data.resize(size_t(numel(x.shape)));
    for (float& v : x.data) v = n(rng);
  }
  return t;
}

std::vector<proto::TensorChunk> chunks(const TensorList& t, proto::Encoding e) {
  std::vector<proto::TensorChunk> out;
  for_each_chunk(t, e, [&](proto::TensorChunk& c) {
    out.push_back(c);
    return true;
  });
  return out;
}

TEST(Tensors, RoundTripF32IsExact) {
  TensorList t = sample();
  auto cs = chunks(t, proto::F32);
  EXPECT_EQ(cs.size(), 4u);  // a, b in two chunks of <= 1 MiB, c
  Assembler as(t);
  for (const auto& c : cs) ASSERT_EQ(as.add(c), "");
  EXPECT_EQ(as.finish(), "");
  for (size_t i = 0; i < t.size(); ++i) EXPECT_EQ(as.tensors()[i].data, t[i].data);
  EXPECT_EQ(as.bytes_received(), size_t(total_elements(t)) * 4);
}

TEST(Tensors, RoundTripBf16RoundsToNearestEven) {
  TensorList t = sample();
  Assembler as(t);
  for (const auto& c : chunks(t, proto::BF16)) ASSERT_EQ(as.add(c), "");
  EXPECT_EQ(as.finish(), "");
  EXPECT_EQ(as.bytes_received(), size_t(total_elements(t)) * 2);
  for (size_t i = 0; i < t.size(); ++i)
    for (size_t j = 0; j < t[i].data.size(); ++j)
      ASSERT_EQ(as.tensors()[i].data[j], bf16_to_f32(f32_to_bf16(t[i].data[j])));
}

// int8 and int4 (streaming DiLoCo's quantised outer gradients): every element within half a step
// of its block's scale (absmax / 127 or / 7), an all-zero block exact, and about 3.8x and 7.1x
// fewer bytes than f32.
TEST(Tensors, RoundTripInt8AndInt4WithinHalfAStepOfTheirBlock) {
  TensorList t = sample();
  std::fill(t[1].data.begin() + 640, t[1].data.begin() + 704, 0.f);  // a zero block
  for (auto [e, top] : {std::pair{proto::INT8, 127.f}, std::pair{proto::INT4, 7.f}}) {
    size_t bytes = 0;
    Assembler as(t);
    for (const auto& c : chunks(t, e)) {
      bytes += c.data().size();
      ASSERT_EQ(as.add(c), "");
    }
    ASSERT_EQ(as.finish(), "");
    for (size_t k = 0; k < t.size(); ++k) {
      const auto& x = t[k].data;
      const auto& y = as.tensors()[k].data;
      for (size_t b = 0; b < x.size(); b += 64) {
        // blocks restart at each chunk, and every chunk holds a multiple of 64 elements
        const size_t hi = std::min(x.size(), b + 64);
        float amax = 0;
        for (size_t i = b; i < hi; ++i) amax = std::max(amax, std::fabs(x[i]));
        for (size_t i = b; i < hi; ++i)
          ASSERT_LE(std::fabs(x[i] - y[i]), amax / top / 2 * 1.0001f + 1e-30f) << k << " " << i;
      }
    }
    EXPECT_EQ(as.tensors()[1].data[650], 0.f);
    const double ratio = double(total_elements(t)) * 4 / double(bytes);
    EXPECT_NEAR(ratio, e == proto::INT8 ? 3.76 : 7.1, 0.05) << ratio;
  }
}

TEST(Tensors, BadQuantisedChunksAreNamed) {
  TensorList t{{"w", {100}, std::vector<float>(100, 0.5f)}};
  proto::TensorChunk good = chunks(t, proto::INT4)[0];
  auto refused = [&](const proto::TensorChunk& c, const std::string& want) {
    Assembler as(t);
    const std::string err = as.add(c);
    EXPECT_NE(err.find(want), std::string::npos) << err;
  };
  proto::TensorChunk c = good;
  c.set_count(101);
  refused(c, "int4 chunk of 101 elements takes");
  c = good;
  c.set_count(0);
  refused(c, "takes");
  c = good;
  const float bad[] = {-1.f, NAN, INFINITY};
  for (float v : bad) {
    std::string d = good.data();
    std::memcpy(d.data() + 4, &v, 4);  // the second block's scale
    c.set_data(d);
    refused(c, "block 1 of the chunk at 0 has scale");
  }
  c = good;
  c.set_encoding(proto::INT8);  // int8 of 100 elements needs 108 bytes, int4's are 58
  refused(c, "int8 chunk of 100 elements takes 108 bytes, not 58");
  // a huge scale times 127 overflows f32: refused as non-finite, as any push would be
  c = chunks(t, proto::INT8)[0];
  std::string d = c.data();
  const float huge = 3e38f;
  std::memcpy(d.data(), &huge, 4);
  c.set_data(d);
  refused(c, "non-finite value at element 0");
}

TEST(Tensors, EachBadChunkIsNamed) {
  TensorList t = sample(10);
  auto good = chunks(t, proto::F32);
  auto expect_error = [&](proto::TensorChunk c, const std::string& what) {
    Assembler as(t);
    std::string err = as.add(c);
    EXPECT_NE(err.find(what), std::string::npos) << err;
    EXPECT_EQ(as.bytes_received(), 0u);
  };
  proto::TensorChunk c = good[0];
  c.set_name("z");
  expect_error(c, "expected a chunk of tensor 'a', got 'z'");
  c = good[0];
  c.set_offset(2);
  expect_error(c, "chunk at element 2, expected 0");
  c = good[0];
  c.mutable_data()->append(4, '\0');
  expect_error(c, "overruns its 6 elements");
  c = good[0];
  c.mutable_data()->pop_back();
  expect_error(c, "not a whole number of 4-byte elements");
  c = good[0];
  c.set_encoding(proto::Encoding(7));
  expect_error(c, "unknown encoding 7");
  c = good[0];
  float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(c.mutable_data()->data() + 8, &nan, 4);
  expect_error(c, "non-finite value at element 2");
  c = good[0];
  c.clear_data();
  expect_error(c, "a chunk of 0 bytes");

  Assembler as(t);
  ASSERT_EQ(as.add(good[0]), "");
  EXPECT_NE(as.finish().find("tensor 'b.weight' [10] incomplete: 0 of 10"), std::string::npos);
  ASSERT_EQ(as.add(good[1]), "");
  ASSERT_EQ(as.add(good[2]), "");
  EXPECT_NE(as.add(good[2]).find("after every tensor was complete"), std::string::npos);
  EXPECT_EQ(as.finish(), "");
}

// Whatever bytes arrive, parsing and assembling either succeeds or reports; ASan (the asan preset)
// checks that nothing is read or written out of bounds.
TEST(Tensors, FuzzRandomAndMutatedRequests) {
  TensorList t = sample(64);
  std::vector<std::string> valid;
  for (const auto& c : chunks(t, proto::BF16)) {
    proto::PushRequest r;
    *r.mutable_chunk() = c;
    valid.push_back(r.SerializeAsString());
  }
  std::mt19937 rng(7);
  int parsed = 0, accepted = 0;
  for (int it = 0; it < 20000; ++it) {
    std::string bytes;
    if (it % 2 == 0) {
      bytes.resize(rng() % 300);
      for (char& b : bytes) b = char(rng());
    } else {
      bytes = valid[rng() % valid.size()];
      for (int k = 0, n = 1 + int(rng() % 4); k < n && !bytes.empty(); ++k)
        bytes[rng() % bytes.size()] = char(rng());
    }
    proto::PushRequest r;
    if (!r.ParseFromString(bytes)) continue;
    ++parsed;
    Assembler as(t);
    if (r.has_chunk() && as.add(r.chunk()).empty()) ++accepted;
    (void)as.finish();
  }
  EXPECT_GT(parsed, 1000);  // the fuzzer reached the assembler
  EXPECT_GT(accepted, 0);
}

}  // namespace
}  // namespace loom::outer
