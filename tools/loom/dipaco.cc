// loom dipaco: DiPaCo's router and its evaluation. The work is dipaco/route.h's (what route writes,
// what eval scores); this file parses the flags, reads weights (a loom islands server directory's
// global parameters too) and prints.
//
//   loom dipaco route CONFIG --base RUN_OR_WEIGHTS --out DIR
//   loom dipaco eval RUN [--dense WEIGHTS]
#include <fmt/format.h>

#include <filesystem>
#include <map>

#include "commands.h"
#include "loom/core/error.h"
#include "loom/core/file.h"
#include "loom/dipaco/route.h"
#include "loom/outer/state_file.h"
#include "loom/train/checkpoint.h"
#include "loom/train/params.h"

namespace loom::cli {

namespace fs = std::filesystem;

namespace {

// Weights to read from `path`: a run directory's newest checkpoint, a directory holding
// model.safetensors, a .safetensors file, or a loom islands server directory's global parameters
// (outer_state.safetensors).
void load_weights(const std::string& path, train::ParamStore& params) {
  if (const std::string state = outer::state_file(path); path_exists(state)) {
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

struct Opts {
  std::string config, base, out, run, dense;
  std::vector<std::string> sets;
  int64_t doc_tokens = 512, prefix = 32, iters = 100, seed = 0, holdout_every = 20;
};

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
      ->check(whole_number(2, 1 << 24));
  r->add_option("--prefix", o->prefix, "a document's first tokens the features read")
      ->capture_default_str()
      ->check(whole_number(1, 4096));
  r->add_option("--holdout-every", o->holdout_every,
                "hold out every N-th training document (the in-distribution test documents; 0: "
                "none)")
      ->capture_default_str()
      ->check(whole_number(0, 1 << 20));
  r->add_option("--iters", o->iters, "k-means iterations at most")
      ->capture_default_str()
      ->check(whole_number(1, 10000));
  r->add_option("--seed", o->seed, "k-means++ seed")
      ->capture_default_str()
      ->check(whole_number(0, INT64_MAX));
  r->add_option("--set", o->sets, "override a config key: section.key=value");
  CLI::App* e = d->add_subcommand("eval", "score the routed paths on held-out documents");
  e->add_option("run", o->run, "a DiPaCo loom islands run directory")->required();
  e->add_option("--dense", o->dense,
                "a dense model to score on the same documents: a run or server directory, a "
                "checkpoint or .safetensors");
  return [o, r]() {
    if (!r->parsed()) {
      fmt::print("{}\n", dipaco::evaluate({o->run, o->dense, load_weights}).dump());
      return 0;
    }
    const dipaco::RouteResult res =
        dipaco::route({o->config, o->sets, o->base, o->out, o->doc_tokens, o->prefix, o->iters,
                       o->seed, o->holdout_every, load_weights});
    for (const auto& p : res.paths) fmt::print("{}\n", p.dump());
    fmt::print(stderr,
               "routed {} training documents of {} tokens to {} paths ({} k-means iterations; {} "
               "held out, {} in the validation split); router in {}\n",
               res.train_docs, o->doc_tokens, res.paths.size(), res.iterations, res.held_out,
               res.val_docs, o->out);
    return 0;
  };
}

}  // namespace loom::cli
