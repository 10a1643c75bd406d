#include <fmt/format.h>

#include <cmath>
#include <memory>

#include "loom/core/error.h"
#include "loom/data/text_corpus.h"
#include "loom/dipaco/documents.h"
#include "loom/dipaco/route.h"
#include "loom/dipaco/router.h"
#include "loom/train/checkpoint.h"
#include "loom/train/config.h"
#include "loom/train/step.h"

namespace loom::dipaco {

using data::TextCorpus;
using Split = TextCorpus::Split;

nlohmann::json evaluate(const EvalOptions& o) {
  const std::string& run = o.run;
  train::Config cfg = train::load_run_config(run + "/path_0");
  if (cfg.outer.dipaco.router.empty())
    throw Error(fmt::format("{}/path_0: not a DiPaCo run ([outer] router is not set)", run));
  const Router router = read_router(cfg.outer.dipaco.router);
  const int64_t P = router.paths(), V = cfg.model.vocab_size;
  router.check_features(V, cfg.outer.dipaco.router);
  // what route wrote of the corpus it cut
  std::string source;
  int64_t doc_tokens = 0, every = 0;
  try {
    source = router.meta.at("source").get<std::string>();
    doc_tokens = router.meta.at("doc_tokens").get<int64_t>();
    every = router.meta.value("holdout_every", int64_t(0));
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("router {}: its metadata lacks the corpus it routed: {}",
                            cfg.outer.dipaco.router, e.what()));
  }
  if (doc_tokens < 2 || every < 0)
    throw Error(fmt::format("router {}: doc_tokens {} and holdout_every {} are not a router's",
                            cfg.outer.dipaco.router, doc_tokens, every));
  const int64_t T = cfg.train.seq_len, W = (doc_tokens - 1) / T;  // windows per document
  if (W < 1)
    throw Error(fmt::format("documents of {} tokens are shorter than [train] seq_len + 1 = {}",
                            doc_tokens, T + 1));
  TextCorpus corpus = TextCorpus::open(source, T);
  train::ParamStore base(cfg.model);
  base.load(cfg.outer.dipaco.router + "/base.safetensors");
  std::vector<std::unique_ptr<train::ParamStore>> models;
  for (int64_t p = 0; p < P; ++p) {
    models.push_back(std::make_unique<train::ParamStore>(cfg.model));
    models.back()->load(fmt::format("{}/path_{}/model.safetensors", run, p));
  }
  std::unique_ptr<train::ParamStore> dense;
  if (!o.dense.empty()) {
    dense = std::make_unique<train::ParamStore>(cfg.model);
    o.load_weights(o.dense, *dense);
  }
  train::Config ec = cfg;
  ec.train.batch_size = W;
  std::vector<int32_t> rows(static_cast<size_t>(W * (T + 1)));
  // the mean cross-entropy of `params` on each document (its W windows of T + 1 tokens)
  auto score = [&](train::ParamStore& params, Split s, const std::vector<int64_t>& docs) {
    train::StepRunner eval(ec, params, train::StepRunner::Mode::eval);
    std::vector<double> l;
    for (int64_t st : docs) {
      for (int64_t w = 0; w < W; ++w) corpus.read(s, st + w * T, T + 1, rows.data() + w * (T + 1));
      eval.step(rows.data());
      l.push_back(eval.ce_loss());
    }
    return l;
  };
  // one set of documents: routed, scored by every path (and the dense model)
  auto assess = [&](Split s, const std::vector<int64_t>& docs) {
    const auto x =
        features(cfg.model, base, heads(corpus, s, docs, router.prefix + 1), router.prefix);
    std::vector<std::vector<double>> loss;
    for (auto& m : models) loss.push_back(score(*m, s, docs));
    const std::vector<double> dense_loss = dense ? score(*dense, s, docs) : std::vector<double>();
    const size_t n = docs.size();
    double routed = 0, mean_path = 0, best = 0;
    int64_t beats = 0;
    std::vector<int64_t> routed_docs(static_cast<size_t>(P), 0);
    std::vector<double> routed_loss(static_cast<size_t>(P), 0),
        dense_routed(static_cast<size_t>(P), 0);
    for (size_t d = 0; d < n; ++d) {
      const int64_t p = router.route(x.data() + d * size_t(V));
      double avg = 0, lo = INFINITY;
      for (int64_t q = 0; q < P; ++q) {
        avg += loss[size_t(q)][d] / double(P);
        lo = std::min(lo, loss[size_t(q)][d]);
      }
      routed += loss[size_t(p)][d];
      mean_path += avg;
      best += lo;
      beats += loss[size_t(p)][d] < avg;
      ++routed_docs[size_t(p)];
      routed_loss[size_t(p)] += loss[size_t(p)][d];
      if (dense) dense_routed[size_t(p)] += dense_loss[d];
    }
    nlohmann::json per = nlohmann::json::array();
    for (int64_t p = 0; p < P; ++p) {
      double all = 0;
      for (double v : loss[size_t(p)]) all += v;
      const int64_t r = routed_docs[size_t(p)];
      per.push_back({{"path", p},
                     {"routed_docs", r},
                     {"loss_on_routed", r ? nlohmann::json(routed_loss[size_t(p)] / double(r))
                                          : nlohmann::json(nullptr)},
                     {"loss_on_all", all / double(n)}});
      if (dense)  // the dense model on the documents routed to this path
        per.back()["dense_on_routed"] =
            r ? nlohmann::json(dense_routed[size_t(p)] / double(r)) : nlohmann::json(nullptr);
    }
    nlohmann::json out{{"docs", n},
                       {"routed_loss", routed / double(n)},
                       {"mean_path_loss", mean_path / double(n)},
                       {"best_path_loss", best / double(n)},
                       {"routed_beats_mean_path", double(beats) / double(n)},
                       {"per_path", per}};
    if (dense) {
      double sum = 0;
      for (double v : dense_loss) sum += v;
      out["dense_loss"] = sum / double(n);
    }
    return out;
  };
  // full documents only: each scored over the same W windows
  nlohmann::json out{{"doc_tokens", doc_tokens}};
  if (every > 0) {
    std::vector<int64_t> held;
    const auto all = document_starts(corpus.size(Split::train), doc_tokens, router.prefix);
    for (size_t i = 0; i < all.size(); ++i)
      if (held_out(i, every) && all[i] + doc_tokens <= corpus.size(Split::train))
        held.push_back(all[i]);
    if (!held.empty()) out["heldout"] = assess(Split::train, held);
  }
  const auto val = document_starts(corpus.size(Split::val), doc_tokens, doc_tokens - 1);
  if (!val.empty()) out["val"] = assess(Split::val, val);
  if (!out.contains("heldout") && !out.contains("val"))
    throw Error(fmt::format("{}: no held-out or validation document to score", source));
  return out;
}

}  // namespace loom::dipaco
