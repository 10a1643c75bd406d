// loom dipaco: DiPaCo's router and its evaluation (src/loom/dipaco/router.h,
// src/loom/outer/paths.h).
//
//   loom dipaco route CONFIG --base RUN_OR_WEIGHTS --out DIR
//       cuts CONFIG's [data] training split into documents and holds every --holdout-every-th out
//       (the in-distribution test documents); computes the others' features with the base model,
//       clusters them into the paths of [outer] modules (balanced k-means) and writes the router
//       (DIR/router.safetensors, DIR/base.safetensors), each path's documents as a prepared data
//       directory DIR/path_<p> (train.bin: its documents; val.bin: the held-out documents the
//       router sends it), and DIR/all (every path's documents; val.bin: every held-out one), what a
//       dense model of the same data trains on. `loom islands` with [outer] router = DIR trains
//       the paths.
//   loom dipaco eval RUN [--dense WEIGHTS]
//       RUN: a DiPaCo `loom islands` run (its path_<p>/ models). Two sets of documents, each
//       routed by its first tokens and scored (mean cross-entropy over all its tokens) by every
//       path: "heldout" (the held-out training documents: the training distribution) and "val"
//       (the validation split: for a directory of books, books no path trained on). Prints JSON
//       with, per set, the routed paths' loss, the mean path's, the best path's (an oracle), how
//       often the routed path beats the mean one, per-path figures, and with --dense a dense
//       model's loss on the same documents.
//
// Invariant: a router directory is whole or absent: the data directories are written first, each
// file atomically, and router.safetensors, which marks the directory as a router, last.
#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "loom/core/error.h"
#include "loom/core/file.h"
#include "loom/data/shard.h"
#include "loom/data/text_corpus.h"
#include "loom/dipaco/router.h"
#include "loom/outer/state_file.h"
#include "loom/train/checkpoint.h"
#include "loom/train/config.h"
#include "loom/train/params.h"
#include "loom/train/step.h"

namespace loom::cli {

namespace fs = std::filesystem;
using data::TextCorpus;

namespace {

// Weights to read from `path`: a run directory's newest checkpoint, a directory holding
// model.safetensors, a .safetensors file, or a loom islands server directory's global parameters
// (outer_state.safetensors).
void load_weights(const std::string& path, train::ParamStore& params) {
  if (const std::string state = outer::state_file(path); fs::exists(state)) {
    std::map<std::string, outer::Tensor> got;
    for (auto& t : outer::read_state_params(state)) got[t.name] = std::move(t);
    for (const auto& p : params.infos()) {
      auto it = got.find(p.name);
      if (it == got.end() || it->second.shape != p.shape)
        throw Error(fmt::format("{}: the global parameters do not hold the model's {} {}", state,
                                p.name, shape_str(p.shape)),
                    "a DiPaCo server holds modules, not one model: score its paths instead");
      std::copy(it->second.data.begin(), it->second.data.end(), params.data(p.name));
    }
    return;
  }
  if (auto f = train::model_file(path)) return params.load(*f);
  params.load(train::run_weights(path, ""));
}

// Each document's first `n` tokens (fewer if it is shorter).
std::vector<std::vector<int32_t>> heads(const TextCorpus& c, TextCorpus::Split s,
                                        const std::vector<int64_t>& starts, int64_t n) {
  std::vector<std::vector<int32_t>> out;
  for (int64_t st : starts) {
    const int64_t k = std::min(n, c.size(s) - st);
    out.emplace_back(size_t(k));
    c.read(s, st, k, out.back().data());
  }
  return out;
}

struct Opts {
  std::string config, base, out, run, dense;
  std::vector<std::string> sets;
  int64_t doc_tokens = 512, prefix = 32, iters = 100, seed = 0, holdout_every = 20;
};

using Split = TextCorpus::Split;

// The held-out documents among a split's: every `every`-th (none when every is 0).
bool held_out(size_t i, int64_t every) {
  return every > 0 && int64_t(i % size_t(every)) == every - 1;
}

// Documents (starts) of `s` as one token list.
std::vector<int32_t> tokens_of(const TextCorpus& c, Split s, const std::vector<int64_t>& starts,
                               int64_t doc_tokens) {
  std::vector<int32_t> t;
  for (int64_t st : starts) {
    const int64_t n = std::min(doc_tokens, c.size(s) - st);
    t.resize(t.size() + size_t(n));
    c.read(s, st, n, t.data() + t.size() - size_t(n));
  }
  return t;
}

// A prepared data directory (shard.h, text_corpus.h) of `train` and `val` tokens, with the source
// corpus's tokenizer when it has one.
void write_data_dir(const std::string& dir, const TextCorpus& c, const std::string& source,
                    const std::vector<int32_t>& train, const std::vector<int32_t>& val,
                    nlohmann::json meta) {
  fs::create_directories(dir);
  data::write_shard(dir + "/train.bin", train, c.vocab_size());
  data::write_shard(dir + "/val.bin", val, c.vocab_size());
  meta.update({{"format", "loom-data"},
               {"version", 1},
               {"vocab_size", c.vocab_size()},
               {"train_tokens", train.size()},
               {"val_tokens", val.size()},
               {"input", source}});
  if (c.prepared()) {  // the tokenizer travels with the data
    const nlohmann::json src = nlohmann::json::parse(read_file(c.meta_path()));
    for (const char* key : {"tokenizer", "tokenizer_model"})
      if (src.contains(key)) meta[key] = src[key];
    for (const char* f : {"tokenizer.model", "tokenizer.vocab", "tokenizer.json"})
      if (fs::exists(source + "/" + f))
        fs::copy_file(source + "/" + f, dir + "/" + f, fs::copy_options::overwrite_existing);
  }
  write_file_atomic(dir + "/meta.json", meta.dump(2) + "\n");
}

int route(const Opts& o) {
  train::Config cfg = train::load_config(o.config, o.sets);
  const int64_t P = cfg.outer.paths();
  if (P == 0)
    throw Error(
        fmt::format("{}: [outer] modules is not set: there are no paths to route to", o.config));
  if (fs::exists(o.out + "/router.safetensors"))
    throw Error(fmt::format("{} already holds a router", o.out),
                "choose another --out, or remove it");
  if (cfg.data.path.empty()) throw Error(fmt::format("{}: [data] path is not set", o.config));
  TextCorpus corpus = TextCorpus::open(cfg.data.path, cfg.train.seq_len);
  if (corpus.vocab_size() > cfg.model.vocab_size)
    throw Error(fmt::format("{}: the data's vocabulary ({}) exceeds [model] vocab_size = {}",
                            o.config, corpus.vocab_size(), cfg.model.vocab_size));
  train::ParamStore base(cfg.model);
  load_weights(o.base, base);
  // the training split's documents: every holdout_every-th held out (the in-distribution test
  // documents), the rest clustered
  std::vector<int64_t> train_docs, held;
  const auto all = dipaco::document_starts(corpus.size(Split::train), o.doc_tokens, o.prefix);
  for (size_t i = 0; i < all.size(); ++i)
    (held_out(i, o.holdout_every) ? held : train_docs).push_back(all[i]);
  const auto val_docs = dipaco::document_starts(corpus.size(Split::val), o.doc_tokens, o.prefix);
  if (int64_t(train_docs.size()) < P)
    throw Error(fmt::format("{}: {} documents of {} tokens for {} paths", cfg.data.path,
                            train_docs.size(), o.doc_tokens, P),
                "use shorter --doc-tokens, or fewer paths");
  const int64_t V = cfg.model.vocab_size;
  const auto x = dipaco::features(cfg.model, base,
                                  heads(corpus, Split::train, train_docs, o.prefix + 1), o.prefix);
  const dipaco::Clusters k =
      dipaco::kmeans(x, V, P, int(o.iters), uint64_t(o.seed), /*balanced=*/true);
  dipaco::Router router;
  router.prefix = o.prefix;
  router.dim = V;
  router.centroids = k.centroids;
  // a path's validation documents: the held-out ones the router sends it (the validation split's
  // without held-out documents)
  const Split vsplit = held.empty() ? Split::val : Split::train;
  const std::vector<int64_t>& vdocs = held.empty() ? val_docs : held;
  const auto xv =
      dipaco::features(cfg.model, base, heads(corpus, vsplit, vdocs, o.prefix + 1), o.prefix);
  std::vector<std::vector<int64_t>> train_of(static_cast<size_t>(P)),
      val_of(static_cast<size_t>(P));
  for (size_t i = 0; i < train_docs.size(); ++i)
    train_of[size_t(k.assign[i])].push_back(train_docs[i]);
  for (size_t i = 0; i < vdocs.size(); ++i)
    val_of[size_t(router.route(xv.data() + i * size_t(V)))].push_back(vdocs[i]);
  fs::create_directories(o.out);
  nlohmann::json paths = nlohmann::json::array();
  for (int64_t p = 0; p < P; ++p) {
    const std::vector<int32_t> tr =
        tokens_of(corpus, Split::train, train_of[size_t(p)], o.doc_tokens);
    std::vector<int32_t> va = tokens_of(corpus, vsplit, val_of[size_t(p)], o.doc_tokens);
    // a path the router sends too little validation text to validates on all of it
    const bool all_val = int64_t(va.size()) < 2 * (cfg.train.seq_len + 1);
    if (all_val) va = tokens_of(corpus, vsplit, vdocs, o.doc_tokens);
    nlohmann::json line{{"path", p},
                        {"train_docs", train_of[size_t(p)].size()},
                        {"train_tokens", tr.size()},
                        {"val_docs", val_of[size_t(p)].size()}};
    write_data_dir(fmt::format("{}/path_{}", o.out, p), corpus, cfg.data.path, tr, va,
                   {{"dipaco_path", p}, {"val_is_all", all_val}, {"router", line}});
    paths.push_back(line);
  }
  // every path's documents together: what a dense model of the same data trains on
  write_data_dir(o.out + "/all", corpus, cfg.data.path,
                 tokens_of(corpus, Split::train, train_docs, o.doc_tokens),
                 tokens_of(corpus, vsplit, vdocs, o.doc_tokens), {{"dipaco_path", "all"}});
  base.save(o.out + "/base.safetensors");
  router.meta = {{"modules", cfg.outer.modules},
                 {"doc_tokens", o.doc_tokens},
                 {"holdout_every", o.holdout_every},
                 {"source", cfg.data.path},
                 {"base", o.base},
                 {"kmeans_iterations", k.iterations},
                 {"paths", paths}};
  dipaco::write_router(o.out, router);
  for (const auto& p : paths) fmt::print("{}\n", p.dump());
  fmt::print(stderr,
             "routed {} training documents of {} tokens to {} paths ({} k-means iterations; {} "
             "held out, {} in the validation split); router in {}\n",
             train_docs.size(), o.doc_tokens, P, k.iterations, held.size(), val_docs.size(), o.out);
  return 0;
}

int evaluate(const Opts& o) {
  const std::string& run = o.run;
  train::Config cfg = train::load_run_config(run + "/path_0");
  if (cfg.outer.router.empty())
    throw Error(fmt::format("{}/path_0: not a DiPaCo run ([outer] router is not set)", run));
  const dipaco::Router router = dipaco::read_router(cfg.outer.router);
  const int64_t P = router.paths(), V = cfg.model.vocab_size;
  router.check_features(V, cfg.outer.router);
  // what route wrote of the corpus it cut
  std::string source;
  int64_t doc_tokens = 0, every = 0;
  try {
    source = router.meta.at("source").get<std::string>();
    doc_tokens = router.meta.at("doc_tokens").get<int64_t>();
    every = router.meta.value("holdout_every", int64_t(0));
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("router {}: its metadata lacks the corpus it routed: {}",
                            cfg.outer.router, e.what()));
  }
  if (doc_tokens < 2 || every < 0)
    throw Error(fmt::format("router {}: doc_tokens {} and holdout_every {} are not a router's",
                            cfg.outer.router, doc_tokens, every));
  const int64_t T = cfg.train.seq_len, W = (doc_tokens - 1) / T;  // windows per document
  if (W < 1)
    throw Error(fmt::format("documents of {} tokens are shorter than [train] seq_len + 1 = {}",
                            doc_tokens, T + 1));
  TextCorpus corpus = TextCorpus::open(source, T);
  train::ParamStore base(cfg.model);
  base.load(cfg.outer.router + "/base.safetensors");
  std::vector<std::unique_ptr<train::ParamStore>> models;
  for (int64_t p = 0; p < P; ++p) {
    models.push_back(std::make_unique<train::ParamStore>(cfg.model));
    models.back()->load(fmt::format("{}/path_{}/model.safetensors", run, p));
  }
  std::unique_ptr<train::ParamStore> dense;
  if (!o.dense.empty()) {
    dense = std::make_unique<train::ParamStore>(cfg.model);
    load_weights(o.dense, *dense);
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
        dipaco::features(cfg.model, base, heads(corpus, s, docs, router.prefix + 1), router.prefix);
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
    const auto all = dipaco::document_starts(corpus.size(Split::train), doc_tokens, router.prefix);
    for (size_t i = 0; i < all.size(); ++i)
      if (held_out(i, every) && all[i] + doc_tokens <= corpus.size(Split::train))
        held.push_back(all[i]);
    if (!held.empty()) out["heldout"] = assess(Split::train, held);
  }
  const auto val = dipaco::document_starts(corpus.size(Split::val), doc_tokens, doc_tokens - 1);
  if (!val.empty()) out["val"] = assess(Split::val, val);
  if (!out.contains("heldout") && !out.contains("val"))
    throw Error(fmt::format("{}: no held-out or validation document to score", source));
  fmt::print("{}\n", out.dump());
  return 0;
}

}  // namespace

std::function<int()> add_dipaco(CLI::App& app) {
  CLI::App* d = app.add_subcommand("dipaco", "DiPaCo: route documents to paths, evaluate paths");
  d->require_subcommand(1);
  auto o = std::make_shared<Opts>();
  CLI::App* r = d->add_subcommand("route", "cluster [data]'s documents into the paths");
  r->add_option("config", o->config, "the DiPaCo config ([outer] modules, [data], [model])")
      ->required();
  r->add_option("--base", o->base,
                "the base model computing the features: a run directory, a checkpoint or "
                ".safetensors")
      ->required();
  r->add_option("--out", o->out, "the router directory to write")->required();
  r->add_option("--doc-tokens", o->doc_tokens, "tokens per document")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(2), int64_t(1) << 24));
  r->add_option("--prefix", o->prefix, "a document's first tokens the features read")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  r->add_option("--holdout-every", o->holdout_every,
                "hold out every N-th training document (the in-distribution test documents; 0: "
                "none)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  r->add_option("--iters", o->iters, "k-means iterations at most")
      ->capture_default_str()
      ->check(CLI::Range(1, 10000));
  r->add_option("--seed", o->seed, "k-means++ seed")->capture_default_str();
  r->add_option("--set", o->sets, "override a config key: section.key=value");
  CLI::App* e = d->add_subcommand("eval", "score the routed paths on held-out documents");
  e->add_option("run", o->run, "a DiPaCo loom islands run directory")->required();
  e->add_option("--dense", o->dense,
                "a dense model to score on the same documents: a run or server directory, a "
                "checkpoint or .safetensors");
  return [o, r]() { return r->parsed() ? route(*o) : evaluate(*o); };
}

}  // namespace loom::cli
