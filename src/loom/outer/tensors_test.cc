// Chunking and the Assembler, the decoder of every tensor that comes off the network: round trips,
// each kind of bad chunk, and fuzzing with random and mutated requests.
#include "loom/outer/tensors.h"

#include <gtest/gtest.h>

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
