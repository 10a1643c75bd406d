// DiPaCo's router: documents, balanced and plain k-means on separable points, features that are
// Hellinger embeddings of the base model's predictions, routing to the nearest centroid, and a
// router that survives the disk (and a damaged one that is an error).
#include "loom/dipaco/router.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "loom/core/error.h"
#include "loom/core/file.h"

namespace loom::dipaco {
namespace {

namespace fs = std::filesystem;

TEST(Router, DocumentsAreConsecutiveRunsAndAShortLastOneOnlyWhenLongEnough) {
  EXPECT_EQ(document_starts(10, 4, 1), (std::vector<int64_t>{0, 4, 8}));  // last: 2 tokens > 1
  EXPECT_EQ(document_starts(10, 4, 2), (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(document_starts(8, 4, 3), (std::vector<int64_t>{0, 4}));
}

// n points around each of three far-apart centres in 2-D, interleaved.
std::vector<float> blobs(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> noise(0, 0.1f);
  const float c[3][2] = {{0, 0}, {10, 0}, {0, 10}};
  std::vector<float> x;
  for (int i = 0; i < 3 * n; ++i) {
    x.push_back(c[i % 3][0] + noise(rng));
    x.push_back(c[i % 3][1] + noise(rng));
  }
  return x;
}

TEST(Router, KMeansFindsSeparatedClustersAndIsDeterministic) {
  const std::vector<float> x = blobs(20, 1);
  for (bool balanced : {false, true}) {
    const Clusters c = kmeans(x, 2, 3, 100, 7, balanced);
    ASSERT_EQ(c.assign.size(), 60u);
    // every blob in one cluster, the three clusters distinct
    for (int i = 3; i < 60; ++i) EXPECT_EQ(c.assign[size_t(i)], c.assign[size_t(i % 3)]) << i;
    EXPECT_NE(c.assign[0], c.assign[1]);
    EXPECT_NE(c.assign[1], c.assign[2]);
    EXPECT_NE(c.assign[0], c.assign[2]);
    EXPECT_LT(c.iterations, 100);
    const Clusters again = kmeans(x, 2, 3, 100, 7, balanced);
    EXPECT_EQ(again.assign, c.assign);
    EXPECT_EQ(again.centroids, c.centroids);
  }
}

TEST(Router, BalancedKMeansCapsEachClusterAtItsShare) {
  // 50 points in one blob and 10 in another: 2 balanced clusters take 30 each
  std::vector<float> x;
  for (int i = 0; i < 60; ++i) {
    x.push_back(i < 50 ? 0.01f * float(i) : 100.f + 0.01f * float(i));
    x.push_back(0);
  }
  const Clusters plain = kmeans(x, 2, 2, 100, 1, false);
  const Clusters bal = kmeans(x, 2, 2, 100, 1, true);
  auto size_of = [](const Clusters& c, int64_t k) {
    return std::count(c.assign.begin(), c.assign.end(), k);
  };
  EXPECT_EQ(std::max(size_of(plain, 0), size_of(plain, 1)), 50);
  EXPECT_EQ(size_of(bal, 0), 30);
  EXPECT_EQ(size_of(bal, 1), 30);
  // the far blob stays whole in one balanced cluster
  for (int i = 51; i < 60; ++i) EXPECT_EQ(bal.assign[size_t(i)], bal.assign[50]);
  EXPECT_THROW(kmeans(x, 2, 61, 10, 1, true), Error);
  EXPECT_THROW(kmeans(x, 2, 0, 10, 1, true), Error);
}

TEST(Router, RoutesToTheNearestCentroid) {
  Router r;
  r.dim = 2;
  r.centroids = {0, 0, 10, 0, 0, 10};
  ASSERT_EQ(r.paths(), 3);
  const float a[] = {9, 1}, b[] = {1, 8}, tie[] = {5, 0};
  EXPECT_EQ(r.route(a), 1);
  EXPECT_EQ(r.route(b), 2);
  EXPECT_EQ(r.route(tie), 0);  // equidistant from 0 and 1: the lower
  EXPECT_NO_THROW(r.check_features(2, "dir"));
  EXPECT_THROW(r.check_features(3, "dir"), Error);  // a model of another vocabulary
}

TEST(Router, FeaturesAreTheSquareRootOfTheMeanPredictedDistribution) {
  models::ModelConfig m;
  m.arch = "llama";
  m.vocab_size = 16;
  m.d_model = 16;
  m.n_layers = 1;
  m.n_heads = 2;
  m.n_kv_heads = 2;
  m.max_seq_len = 8;
  train::ParamStore base(m);
  base.init_random(3);
  const std::vector<std::vector<int32_t>> docs{{1, 2, 3, 4, 5, 6}, {7, 7, 7, 7, 7, 7}, {3, 1}};
  const std::vector<float> f = features(m, base, docs, 4);
  ASSERT_EQ(f.size(), 3 * 16u);
  for (size_t d = 0; d < 3; ++d) {
    double sq = 0;
    for (size_t v = 0; v < 16; ++v) {
      EXPECT_GE(f[d * 16 + v], 0.f);
      sq += double(f[d * 16 + v]) * f[d * 16 + v];
    }
    EXPECT_NEAR(sq, 1.0, 1e-5) << "a distribution's square roots have norm 1";
  }
  // a document's features depend on its first `prefix` tokens only, whatever else is batched
  const std::vector<float> g = features(m, base, {{1, 2, 3, 4, 9, 9}}, 4);
  for (size_t v = 0; v < 16; ++v) EXPECT_NEAR(g[v], f[v], 1e-6f);
  EXPECT_GT(std::abs(f[0] - f[16]) + std::abs(f[1] - f[17]), 0.f);
}

TEST(Router, ARouterSurvivesTheDiskAndADamagedOneIsAnError) {
  const std::string dir = testing::TempDir() + "/router_test";
  fs::remove_all(dir);
  fs::create_directories(dir);
  EXPECT_THROW(read_router(dir), Error);  // none yet
  Router r;
  r.prefix = 8;
  r.dim = 2;
  r.centroids = {1, 2, 3, 4};
  r.meta = {{"modules", {2}}};
  write_router(dir, r);
  const Router back = read_router(dir);
  EXPECT_EQ(back.prefix, 8);
  EXPECT_EQ(back.paths(), 2);
  EXPECT_EQ(back.centroids, r.centroids);
  EXPECT_EQ(back.meta.at("modules"), r.meta.at("modules"));
  write_file_atomic(dir + "/router.safetensors", std::string_view("not a safetensors file"));
  EXPECT_THROW(read_router(dir), Error);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace loom::dipaco
