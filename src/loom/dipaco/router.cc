#include "loom/dipaco/router.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <numeric>
#include <random>

#include "loom/core/error.h"
#include "loom/core/file.h"
#include "loom/core/safetensors.h"
#include "loom/train/step.h"

namespace loom::dipaco {

namespace fs = std::filesystem;

int64_t Router::route(const float* feature) const {
  int64_t best = 0;
  double best_d = std::numeric_limits<double>::infinity();
  for (int64_t c = 0; c < paths(); ++c) {
    const float* m = centroids.data() + c * dim;
    double d = 0;
    for (int64_t i = 0; i < dim; ++i) d += double(feature[i] - m[i]) * double(feature[i] - m[i]);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  return best;
}

void Router::check_features(int64_t vocab, const std::string& dir) const {
  if (dim != vocab)
    throw Error(fmt::format("router {}: its centroids are of {} features, the model's vocabulary "
                            "has {} tokens",
                            dir, dim, vocab),
                "route with the model the paths were trained from");
}

std::vector<int64_t> document_starts(int64_t tokens, int64_t doc_tokens, int64_t min_tokens) {
  LOOM_CHECK(doc_tokens > 0) << "documents of " << doc_tokens << " tokens";
  std::vector<int64_t> out;
  for (int64_t s = 0; s < tokens; s += doc_tokens)
    if (std::min(doc_tokens, tokens - s) > min_tokens) out.push_back(s);
  return out;
}

std::vector<float> features(const models::ModelConfig& model, train::ParamStore& base,
                            const std::vector<std::vector<int32_t>>& docs, int64_t prefix) {
  const int64_t V = model.vocab_size;
  std::vector<float> out(docs.size() * size_t(V), 0.f);
  // documents by the positions they give (their first T tokens are read, T <= prefix)
  std::map<int64_t, std::vector<size_t>> by_len;
  for (size_t d = 0; d < docs.size(); ++d) {
    if (docs[d].empty()) throw Error(fmt::format("routing: document {} is empty", d));
    by_len[std::min<int64_t>(prefix, int64_t(docs[d].size()))].push_back(d);
  }
  constexpr int64_t B = 32;
  for (const auto& [T, which] : by_len) {
    if (T > model.max_seq_len)
      throw Error(
          fmt::format("routing: a prefix of {} tokens exceeds the base model's "
                      "max_seq_len = {}",
                      T, model.max_seq_len));
    train::Config cfg;
    cfg.model = model;
    cfg.train.batch_size = B;
    cfg.train.seq_len = T;
    train::StepRunner eval(cfg, base, train::StepRunner::Mode::infer);  // keeps the logits
    std::vector<int32_t> rows(static_cast<size_t>(B * (T + 1)));
    std::vector<double> mean(static_cast<size_t>(V));
    for (size_t first = 0; first < which.size(); first += size_t(B)) {
      const size_t n = std::min(which.size() - first, size_t(B));
      for (size_t r = 0; r < size_t(B); ++r) {  // a short batch repeats its first document
        const std::vector<int32_t>& doc = docs[which[first + (r < n ? r : 0)]];
        int32_t* row = rows.data() + r * size_t(T + 1);
        for (int64_t t = 0; t <= T; ++t) row[t] = t < int64_t(doc.size()) ? doc[size_t(t)] : 0;
      }
      eval.step(rows.data());
      const float* logits = eval.logits();
      for (size_t r = 0; r < n; ++r) {
        std::fill(mean.begin(), mean.end(), 0.0);
        for (int64_t t = 0; t < T; ++t) {
          const float* l = logits + (int64_t(r) * T + t) * V;
          const float top = *std::max_element(l, l + V);
          double sum = 0;
          for (int64_t v = 0; v < V; ++v) sum += std::exp(double(l[v] - top));
          for (int64_t v = 0; v < V; ++v) mean[size_t(v)] += std::exp(double(l[v] - top)) / sum;
        }
        float* f = out.data() + which[first + r] * size_t(V);
        for (int64_t v = 0; v < V; ++v) f[v] = float(std::sqrt(mean[size_t(v)] / double(T)));
      }
    }
  }
  return out;
}

namespace {

double dist2(const float* a, const float* b, int64_t dim) {
  double d = 0;
  for (int64_t i = 0; i < dim; ++i) d += double(a[i] - b[i]) * double(a[i] - b[i]);
  return d;
}

}  // namespace

Clusters kmeans(const std::vector<float>& x, int64_t dim, int64_t k, int max_iters, uint64_t seed,
                bool balanced) {
  const int64_t n = dim > 0 ? int64_t(x.size()) / dim : 0;
  if (k < 1 || k > n)
    throw Error(
        fmt::format("k-means: {} clusters of {} documents: need 1 <= clusters <= "
                    "documents",
                    k, n));
  auto pt = [&](int64_t i) { return x.data() + i * dim; };
  Clusters c;
  c.centroids.resize(size_t(k * dim));
  // k-means++: the first centre at random, each next one drawn with probability ~ d^2 to the
  // nearest centre so far
  std::mt19937_64 rng(seed);
  auto uniform = [&] { return double(rng() >> 11) * 0x1.0p-53; };
  std::vector<double> d2(size_t(n), std::numeric_limits<double>::infinity());
  int64_t pick = int64_t(uniform() * double(n));
  for (int64_t j = 0; j < k; ++j) {
    std::copy(pt(pick), pt(pick) + dim, c.centroids.begin() + j * dim);
    double total = 0;
    for (int64_t i = 0; i < n; ++i)
      total += d2[size_t(i)] = std::min(d2[size_t(i)], dist2(pt(i), pt(pick), dim));
    if (j + 1 == k) break;
    double u = uniform() * total, acc = 0;
    pick = n - 1;
    for (int64_t i = 0; i < n; ++i)
      if ((acc += d2[size_t(i)]) > u && d2[size_t(i)] > 0) {
        pick = i;
        break;
      }
  }
  c.assign.assign(size_t(n), -1);
  const int64_t cap = (n + k - 1) / k;
  std::vector<double> d(static_cast<size_t>(n * k));
  for (c.iterations = 0; c.iterations < max_iters; ++c.iterations) {
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < k; ++j)
        d[size_t(i * k + j)] = dist2(pt(i), c.centroids.data() + j * dim, dim);
    std::vector<int64_t> next(size_t(n), -1);
    if (!balanced) {
      for (int64_t i = 0; i < n; ++i)
        next[size_t(i)] =
            std::min_element(d.begin() + i * k, d.begin() + (i + 1) * k) - (d.begin() + i * k);
    } else {  // (point, centre) pairs by ascending distance, each point to the first with room
      std::vector<int64_t> order(size_t(n * k));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t a, int64_t b) { return d[size_t(a)] < d[size_t(b)]; });
      std::vector<int64_t> size(size_t(k), 0);
      for (int64_t o : order) {
        const int64_t i = o / k, j = o % k;
        if (next[size_t(i)] >= 0 || size[size_t(j)] >= cap) continue;
        next[size_t(i)] = j;
        ++size[size_t(j)];
      }
    }
    if (next == c.assign) break;
    c.assign = std::move(next);
    // each centre to the mean of its points (a centre with none stays where it is)
    std::vector<double> sum(size_t(k * dim), 0.0);
    std::vector<int64_t> count(size_t(k), 0);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t j = c.assign[size_t(i)];
      ++count[size_t(j)];
      for (int64_t v = 0; v < dim; ++v) sum[size_t(j * dim + v)] += pt(i)[v];
    }
    for (int64_t j = 0; j < k; ++j)
      if (count[size_t(j)])
        for (int64_t v = 0; v < dim; ++v)
          c.centroids[size_t(j * dim + v)] =
              float(sum[size_t(j * dim + v)] / double(count[size_t(j)]));
  }
  return c;
}

void write_router(const std::string& dir, const Router& r) {
  nlohmann::json meta = r.meta;
  meta["format"] = 1;
  meta["prefix"] = r.prefix;
  write_safetensors(dir + "/router.safetensors",
                    {{"centroids", DType::f32, {r.paths(), r.dim}, r.centroids.data()}},
                    {{"loom_router", meta.dump()}});
}

Router read_router(const std::string& dir) {
  const std::string path = dir + "/router.safetensors";
  if (!path_exists(path))
    throw Error(fmt::format("{}: no router here", path),
                "write one with loom dipaco route CONFIG --base RUN --out DIR");
  auto f = SafetensorsFile::open(path);
  Router r;
  auto it = f.metadata().find("loom_router");
  if (it == f.metadata().end() || !f.contains("centroids"))
    throw Error(fmt::format("{}: not a loom router (no loom_router metadata or centroids)", path));
  try {
    r.meta = nlohmann::json::parse(it->second);
    if (r.meta.at("format").get<int>() != 1)
      throw Error(fmt::format("{}: unknown router format {}", path, r.meta.at("format").dump()));
    r.prefix = r.meta.at("prefix").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{}: malformed loom_router metadata: {}", path, e.what()));
  }
  const TensorView& c = f.get("centroids");
  if (c.dtype != DType::f32 || c.shape.size() != 2 || c.shape[0] < 1 || c.shape[1] < 1 ||
      r.prefix < 1)
    throw Error(fmt::format("{}: centroids must be f32 (paths, dim), prefix >= 1", path));
  r.dim = c.shape[1];
  const float* p = static_cast<const float*>(c.data);
  r.centroids.assign(p, p + c.shape[0] * c.shape[1]);
  for (float v : r.centroids)
    if (!std::isfinite(v)) throw Error(fmt::format("{}: a centroid is not finite", path));
  return r;
}

}  // namespace loom::dipaco
