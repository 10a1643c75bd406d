// loom sample: generates text from a run that `loom train` wrote, or from a Hugging Face model
// directory (config.json, weights, tokenizer.json). Tokens are bytes (id = byte value) unless the
// run trained on a `loom data prepare` directory with a tokenizer: then the prompt is encoded and
// the output decoded with RUN_DIR/tokenizer.model or tokenizer.json (copied there by loom train),
// else with the one in the run's [data] path, else its [model] init directory's tokenizer.json. The
// prompt and then the generated text go to stdout as soon as they exist (flushed), so with bytes a
// pipe sees exactly prompt + max_tokens bytes; with BPE, an incomplete UTF-8 character (from
// byte-fallback pieces) is held back until it completes or generation ends.
//
// How: a DecodeRunner (train/decode.h) with a key/value cache of T = --context positions (default:
// the model's max_seq_len, at most 512). The prompt (its last T tokens) is fed once; then each new
// token is fed alone, at the cost of one position's forward plus attention over the cache. When the
// cache is full, the newest T/2 tokens (at least one) are kept and fed again from position 0, so
// the model always sees between T/2 and T tokens of context. Worked example, T = 4, prompt "ab":
// feed "ab" (positions 0-1) -> c; feed c (2) -> d; feed d (3) -> e; the cache is full: keep "de",
// feed it at 0-1 -> f; feed f (2) ...
//
// DiPaCo (--path): RUN is a `loom islands` run of DiPaCo paths (RUN/path_<p>/, src/loom/outer/
// paths.h); --path N samples from path N, --path auto from the path the run's router sends the
// prompt to (the base model's features of its first tokens, the nearest centroid:
// src/loom/dipaco/router.h). The path chosen goes to stderr.
//
// Invariant: the output is a function of (checkpoint, prompt, flags) alone; a given --seed gives
// the same bytes every run. With bytes, sampling draws only from the 256 byte tokens (a larger
// vocabulary's extra ids are never trained on byte-level text and could not be written as bytes);
// with a tokenizer, from its whole vocabulary.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <numeric>
#include <random>
#include <string_view>
#include <vector>

#include "commands.h"
#include "loom/core/error.h"
#include "loom/dipaco/router.h"
#include "loom/tokenizer/tokenizer.h"
#include "loom/train/checkpoint.h"
#include "loom/train/decode.h"
#include "loom/train/hf_dir.h"

namespace loom::cli {

namespace fs = std::filesystem;

namespace {

constexpr int kBytes = 256;  // byte-level tokens: ids 0..255

struct Sampler {
  double temperature;  // 0: greedy
  int64_t top_k;       // 0: off
  std::mt19937_64 rng;

  // logits: (n,) for one position, the candidate ids 0..n-1. Returns the chosen id.
  int next(const float* logits, int n) {
    // Candidates by logit, highest first; ties go to the lower id so the order is fully determined.
    std::vector<int> ids(static_cast<size_t>(n));
    std::iota(ids.begin(), ids.end(), 0);
    std::stable_sort(ids.begin(), ids.end(), [&](int a, int b) { return logits[a] > logits[b]; });
    if (temperature == 0) return ids[0];
    const int k = top_k > 0 ? int(std::min<int64_t>(top_k, n)) : n;
    // softmax over the top k of logits / temperature, in double, shifted by the max for range
    std::vector<double> p(static_cast<size_t>(k));
    const double top = double(logits[ids[0]]) / temperature;
    double sum = 0;
    for (int i = 0; i < k; ++i)
      sum += p[size_t(i)] = std::exp(double(logits[ids[i]]) / temperature - top);
    // 53 random bits in [0, 1): unlike std::uniform_real_distribution, the same on every library
    const double u = double(rng() >> 11) * 0x1.0p-53 * sum;
    double acc = 0;
    for (int i = 0; i < k; ++i) {
      acc += p[size_t(i)];
      if (u < acc) return ids[size_t(i)];
    }
    return ids[size_t(k - 1)];  // u within rounding of sum
  }
};

// The run's tokenizer: RUN_DIR's tokenizer.model or tokenizer.json, else the one in its [data]
// path (a loom data prepare directory), else its [model] init directory's tokenizer.json (a
// pretrained model's), else bytes.
data::Tokenizer run_tokenizer(const std::string& run, const train::Config& cfg) {
  std::error_code ec;
  for (const std::string& dir : {run, cfg.data.path, cfg.init_weights})
    for (const char* name : {"/tokenizer.model", "/tokenizer.json"})
      if (!dir.empty() && fs::is_regular_file(dir + name, ec))
        return data::Tokenizer::load(dir + name);
  return data::Tokenizer::byte_level();
}

// CLI11's NonNegativeNumber prints its bound (1.8e308 in full) and lets "nan" through.
const CLI::Validator kNonNegative(
    [](std::string& in) -> std::string {
      double v = 0;
      if (!CLI::detail::lexical_cast(in, v)) return "expected a number, got '" + in + "'";
      if (!std::isfinite(v) || v < 0) return "must be a finite number >= 0, got " + in;
      return "";
    },
    "NONNEGATIVE");

void put(const void* bytes, size_t n) {
  if (n && std::fwrite(bytes, 1, n, stdout) != n) throw Error("cannot write to stdout");
  std::fflush(stdout);
}

}  // namespace

std::function<int()> add_sample(CLI::App& app) {
  struct Opts {
    std::string run_dir, prompt, checkpoint, path;
    int64_t max_tokens = 200;
    double temperature = 0.8;
    int64_t top_k = 40;
    int64_t seed = 0;
    int64_t context = 0;
    bool stats = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* s =
      app.add_subcommand("sample", "generate text from a trained run or a pretrained model");
  s->add_option("run_dir", o->run_dir,
                "run directory written by loom train, or a Hugging Face model directory")
      ->required();
  s->add_option("--prompt", o->prompt, "text to continue (empty: start from a newline)");
  s->add_option("--max-tokens", o->max_tokens, "tokens to generate (bytes for byte-level runs)")
      ->capture_default_str()
      ->check(kNonNegative);
  s->add_option("--temperature", o->temperature, "softmax temperature; 0 = greedy")
      ->capture_default_str()
      ->check(kNonNegative);
  s->add_option("--top-k", o->top_k, "sample among the k likeliest tokens; 0 = all")
      ->capture_default_str()
      ->check(kNonNegative);
  s->add_option("--seed", o->seed, "random seed (same seed, same text)")
      ->capture_default_str()
      ->check(kNonNegative);
  s->add_option("--checkpoint", o->checkpoint,
                "checkpoint directory or .safetensors (default: the run's newest checkpoint)");
  s->add_option("--context", o->context,
                "tokens of context the model sees (default: [model] max_seq_len, at most 512)")
      ->check(CLI::PositiveNumber);
  s->add_option("--path", o->path,
                "DiPaCo: RUN is a loom islands run of paths; sample from path N, or auto: the "
                "one the router sends the prompt to");
  s->add_flag("--stats", o->stats,
              "print a JSON line of timings to stderr at the end: load, prompt and generation "
              "seconds and tokens/s");
  return [o]() {
    using Clock = std::chrono::steady_clock;
    auto seconds = [](Clock::time_point a, Clock::time_point b) {
      return std::chrono::duration<double>(b - a).count();
    };
    const auto t_start = Clock::now();
    std::string run = o->run_dir;
    if (!o->path.empty()) {  // DiPaCo: one path's model
      train::Config pc = train::load_run_config(run + "/path_0");
      if (pc.outer.router.empty())
        throw Error(
            fmt::format("{}: not a DiPaCo run ([outer] router is not set in "
                        "path_0/config.toml)",
                        run));
      const dipaco::Router router = dipaco::read_router(pc.outer.router);
      router.check_features(pc.model.vocab_size, pc.outer.router);
      int64_t p = -1;
      if (o->path == "auto") {
        const data::Tokenizer tok = run_tokenizer(run + "/path_0", pc);
        std::vector<int32_t> head = tok.encode(o->prompt);
        if (head.empty()) head = tok.encode("\n");
        if (int64_t(head.size()) > router.prefix) head.resize(size_t(router.prefix));
        train::ParamStore base(pc.model);
        base.load(pc.outer.router + "/base.safetensors");
        p = router.route(dipaco::features(pc.model, base, {head}, router.prefix).data());
      } else {
        try {
          size_t used = 0;
          p = std::stoll(o->path, &used);
          if (used != o->path.size()) p = -1;
        } catch (const std::exception&) {
          p = -1;
        }
        if (p < 0 || p >= router.paths())
          throw Error(fmt::format("--path {}: expected auto or a path in [0, {})", o->path,
                                  router.paths()));
      }
      fmt::print(stderr, "dipaco: path {} ({})\n", p, o->path == "auto" ? "routed" : "chosen");
      run = fmt::format("{}/path_{}", run, p);
      if (o->checkpoint.empty()) o->checkpoint = run;
    }
    // a run directory (config.toml, checkpoints), or a Hugging Face model directory (config.json,
    // weights, tokenizer.json: a pretrained model as it is)
    const bool hf = train::is_hf_dir(run) && !fs::exists(run + "/config.toml");
    train::Config cfg;
    if (hf) {
      cfg.model = train::read_hf_model(run);
      cfg.path = run + "/config.json";
      cfg.init_weights = run;
    } else {
      cfg = train::load_run_config(run);
    }
    const std::string config = hf ? cfg.path : run + "/config.toml";
    const data::Tokenizer tok = run_tokenizer(run, cfg);
    if (hf && tok.is_byte_level() && cfg.model.vocab_size != kBytes)
      throw Error(fmt::format("{}: no tokenizer.json beside the model (vocab_size {})", run,
                              cfg.model.vocab_size),
                  "copy the model's tokenizer.json into the directory");
    if (!tok.is_byte_level() && tok.vocab_size() > cfg.model.vocab_size)
      throw Error(fmt::format("the tokenizer's vocabulary does not match the model: {} pieces in "
                              "the tokenizer of {}, [model] vocab_size = {} in {}",
                              tok.vocab_size(), run, cfg.model.vocab_size, config),
                  "the run's tokenizer.model must be the one its data was prepared with");
    if (tok.is_byte_level() && cfg.model.vocab_size < kBytes)
      throw Error(fmt::format("{}: [model] vocab_size = {} is too small for byte-level tokens",
                              config, cfg.model.vocab_size),
                  "loom sample reads byte-level models (vocab_size >= 256), as loom train makes");
    const std::string weights =
        hf && o->checkpoint.empty() ? run : train::run_weights(run, o->checkpoint);
    const int64_t T = o->context ? std::min(o->context, cfg.model.max_seq_len)
                                 : std::min<int64_t>(cfg.model.max_seq_len, 512);
    train::ParamStore params(cfg.model);
    params.load(weights);
    train::DecodeRunner decoder(cfg.model, params, T, config);
    const auto t_loaded = Clock::now();

    // context: the tokens the cache holds (the prompt's last T at first), the newest last
    std::vector<int32_t> context = tok.encode(o->prompt);
    if (context.empty()) context = tok.encode("\n");
    if (int64_t(context.size()) > T) context.erase(context.begin(), context.end() - T);
    put(o->prompt.data(), o->prompt.size());
    const int n = tok.is_byte_level() ? kBytes : tok.vocab_size();  // candidate ids 0..n-1
    // BPE output: decode everything generated so far, print what is new; `all` holds the ids
    std::vector<int32_t> all = tok.encode(o->prompt);
    size_t printed = o->prompt.size();
    auto emit = [&](bool final) {
      std::string text = tok.decode(all);
      size_t stable = text.size();
      const std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD: a byte run not yet UTF-8
      while (!final && stable >= printed + 3 && text.compare(stable - 3, 3, kReplacement) == 0)
        stable -= 3;
      if (stable > printed) put(text.data() + printed, stable - printed);
      printed = std::max(printed, stable);
    };
    Sampler sampler{o->temperature, o->top_k, std::mt19937_64(uint64_t(o->seed))};
    const int64_t prompt_tokens = int64_t(context.size());
    const float* row = o->max_tokens > 0 ? decoder.feed(context.data(), prompt_tokens) : nullptr;
    const auto t_prompt = Clock::now();
    for (int64_t i = 0; i < o->max_tokens; ++i) {
      for (int v = 0; v < n; ++v)
        if (!std::isfinite(row[v]))
          throw Error(fmt::format("weights {}: the logits are not finite ({} for token {})",
                                  weights, row[v], v),
                      "the checkpoint is corrupt or the run diverged; try an earlier checkpoint");
      const int next = sampler.next(row, n);
      context.push_back(next);
      if (tok.is_byte_level()) {
        const unsigned char byte = static_cast<unsigned char>(next);
        put(&byte, 1);
      } else {
        all.push_back(next);
        emit(false);
      }
      if (i + 1 == o->max_tokens) break;
      if (decoder.position() < decoder.capacity()) {
        row = decoder.feed(&context.back(), 1);
      } else {  // the cache is full: keep its newest half (and the new token), encoded again
        const int64_t keep = std::max<int64_t>(1, T / 2);
        context.erase(context.begin(), context.end() - keep);
        decoder.reset();
        row = decoder.feed(context.data(), keep);
      }
    }
    if (!tok.is_byte_level()) emit(true);
    const auto t_end = Clock::now();
    if (::isatty(STDOUT_FILENO)) put("\n", 1);  // a pipe gets exactly prompt + generated bytes
    if (o->stats) {
      // tokens_per_s counts the prompt's encoding too (as a caller waits for it), like timing a
      // whole transformers generate() call; decode_tokens_per_s the tokens after the first only
      const double gen = seconds(t_loaded, t_end), dec = seconds(t_prompt, t_end);
      std::fprintf(stderr,
                   "{\"prompt_tokens\": %ld, \"new_tokens\": %ld, \"context\": %ld, "
                   "\"load_s\": %.4f, \"prompt_s\": %.4f, \"generate_s\": %.4f, "
                   "\"tokens_per_s\": %.3f, \"decode_tokens_per_s\": %.3f}\n",
                   long(prompt_tokens), long(o->max_tokens), long(T), seconds(t_start, t_loaded),
                   seconds(t_loaded, t_prompt), gen, gen > 0 ? double(o->max_tokens) / gen : 0.0,
                   dec > 0 && o->max_tokens > 1 ? double(o->max_tokens - 1) / dec : 0.0);
    }
    return 0;
  };
}

}  // namespace loom::cli
