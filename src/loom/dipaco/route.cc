#include "loom/dipaco/route.h"

#include <fmt/format.h>

#include <filesystem>

#include "loom/core/error.h"
#include "loom/core/file.h"
#include "loom/data/shard.h"
#include "loom/data/text_corpus.h"
#include "loom/dipaco/documents.h"
#include "loom/dipaco/router.h"
#include "loom/train/config.h"

namespace loom::dipaco {

namespace fs = std::filesystem;

namespace {

using data::TextCorpus;
using Split = TextCorpus::Split;

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
  make_directories(dir);
  data::write_shard(dir + "/train.bin", train, c.vocab_size());
  data::write_shard(dir + "/val.bin", val, c.vocab_size());
  meta.update({{"format", "loom-data"},
               {"version", 1},
               {"vocab_size", c.vocab_size()},
               {"train_tokens", train.size()},
               {"val_tokens", val.size()},
               {"input", source},
               {"tokenizer", "byte"}});  // unless the source's, below
  if (c.prepared()) {                    // the tokenizer travels with the data
    const nlohmann::json src = nlohmann::json::parse(read_file(c.meta_path()));
    for (const char* key : {"tokenizer", "tokenizer_model"})
      if (src.contains(key)) meta[key] = src[key];
    for (const char* f : {"tokenizer.model", "tokenizer.vocab", "tokenizer.json"})
      if (path_exists(source + "/" + f))
        fs::copy_file(source + "/" + f, dir + "/" + f, fs::copy_options::overwrite_existing);
  }
  write_file_atomic(dir + "/meta.json", meta.dump(2) + "\n");
}

}  // namespace

RouteResult route(const RouteOptions& o) {
  train::Config cfg = train::load_config(o.config, o.sets);
  const int64_t P = cfg.outer.dipaco.paths();
  if (P == 0)
    throw Error(
        fmt::format("{}: [outer] modules is not set: there are no paths to route to", o.config));
  if (path_exists(o.out + "/router.safetensors"))
    throw Error(fmt::format("{} already holds a router", o.out),
                "choose another --out, or remove it");
  if (cfg.data.path.empty()) throw Error(fmt::format("{}: [data] path is not set", o.config));
  TextCorpus corpus = TextCorpus::open(cfg.data.path, cfg.train.seq_len);
  if (corpus.vocab_size() > cfg.model.vocab_size)
    throw Error(fmt::format("{}: the data's vocabulary ({}) exceeds [model] vocab_size = {}",
                            o.config, corpus.vocab_size(), cfg.model.vocab_size));
  train::ParamStore base(cfg.model);
  o.load_weights(o.base, base);
  // the training split's documents: every holdout_every-th held out (the in-distribution test
  // documents), the rest clustered
  std::vector<int64_t> train_docs, held;
  const auto all = document_starts(corpus.size(Split::train), o.doc_tokens, o.prefix);
  for (size_t i = 0; i < all.size(); ++i)
    (held_out(i, o.holdout_every) ? held : train_docs).push_back(all[i]);
  const auto val_docs = document_starts(corpus.size(Split::val), o.doc_tokens, o.prefix);
  if (int64_t(train_docs.size()) < P)
    throw Error(fmt::format("{}: {} documents of {} tokens for {} paths", cfg.data.path,
                            train_docs.size(), o.doc_tokens, P),
                "use shorter --doc-tokens, or fewer paths");
  const int64_t V = cfg.model.vocab_size;
  const auto x =
      features(cfg.model, base, heads(corpus, Split::train, train_docs, o.prefix + 1), o.prefix);
  const Clusters k = kmeans(x, V, P, int(o.iters), uint64_t(o.seed), /*balanced=*/true);
  Router router;
  router.prefix = o.prefix;
  router.dim = V;
  router.centroids = k.centroids;
  // a path's validation documents: the held-out ones the router sends it (the validation split's
  // without held-out documents)
  const Split vsplit = held.empty() ? Split::val : Split::train;
  const std::vector<int64_t>& vdocs = held.empty() ? val_docs : held;
  const auto xv = features(cfg.model, base, heads(corpus, vsplit, vdocs, o.prefix + 1), o.prefix);
  std::vector<std::vector<int64_t>> train_of(static_cast<size_t>(P)),
      val_of(static_cast<size_t>(P));
  for (size_t i = 0; i < train_docs.size(); ++i)
    train_of[size_t(k.assign[i])].push_back(train_docs[i]);
  for (size_t i = 0; i < vdocs.size(); ++i)
    val_of[size_t(router.route(xv.data() + i * size_t(V)))].push_back(vdocs[i]);
  make_directories(o.out);
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
  router.meta = {{"modules", cfg.outer.dipaco.modules},
                 {"doc_tokens", o.doc_tokens},
                 {"holdout_every", o.holdout_every},
                 {"source", cfg.data.path},
                 {"base", o.base},
                 {"kmeans_iterations", k.iterations},
                 {"paths", paths}};
  write_router(o.out, router);
  return {paths, int64_t(train_docs.size()), int64_t(held.size()), int64_t(val_docs.size()),
          int64_t(k.iterations)};
}

}  // namespace loom::dipaco
