// Helpers for the outer service's tests (rounds, state file, server, optimizer): random tensors and
// a small model, a temporary directory, and a tensor-by-tensor comparison.
//
// Not a library: header-only, included by tests alone. Invariant: a seed gives the same values on
// every call, so a test may draw `model(2)` twice and compare.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <random>
#include <string>

#include "loom/outer/rounds.h"
#include "loom/outer/tensors.h"

namespace loom::outer::test {

// The names and shapes of `t`, with values drawn from N(0, 1), tensor after tensor.
inline TensorList random_like(const TensorList& t, uint32_t seed) {
  TensorList out = zeros_like(t);
  std::mt19937 rng(seed);
  std::normal_distribution<float> n;
  for (auto& x : out)
    for (float& v : x.data) v = n(rng);
  return out;
}

// The outer service tests' model: w [3,4] and b [5], random.
inline TensorList model(uint32_t seed) {
  return random_like({{"w", {3, 4}, {}}, {"b", {5}, {}}}, seed);
}

// A fresh directory under /tmp, removed with what it holds when the object goes.
struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/loom_outer_test_XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

// Same names and sizes, and every element within `tol`; the first differing one is named.
inline void expect_same(const TensorList& a, const TensorList& b, float tol = 0) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t t = 0; t < a.size(); ++t) {
    ASSERT_EQ(a[t].name, b[t].name);
    ASSERT_EQ(a[t].data.size(), b[t].data.size()) << a[t].name;
    for (size_t i = 0; i < a[t].data.size(); ++i)
      ASSERT_NEAR(a[t].data[i], b[t].data[i], tol) << a[t].name << "[" << i << "]";
  }
}

// A model with layers (fragments.h): layers.0.w [3, 4], layers.1.w [2, 2], head [5], random.
inline TensorList layered(uint32_t seed) {
  return random_like(
      {{"layers.0.w", {3, 4}, {}, 0}, {"layers.1.w", {2, 2}, {}, 1}, {"head", {5}, {}}}, seed);
}

// The elementwise mean of two lists of the same tensors.
inline TensorList mean(const TensorList& a, const TensorList& b) {
  TensorList m = zeros_like(a);
  for (size_t t = 0; t < m.size(); ++t)
    for (size_t i = 0; i < m[t].data.size(); ++i)
      m[t].data[i] = (a[t].data[i] + b[t].data[i]) * 0.5f;
  return m;
}

// A refusal of `kind`, and with `message` when one is given.
inline void expect_refused(const std::optional<Refusal>& r, RefusalKind kind,
                           const std::string& message = "") {
  ASSERT_TRUE(r) << "accepted";
  EXPECT_EQ(int(r->kind), int(kind)) << r->message;
  if (!message.empty()) {
    EXPECT_EQ(r->message, message);
  }
}

}  // namespace loom::outer::test
