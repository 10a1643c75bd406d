// loom sample: generates text from a run that `loom train` wrote, from a Hugging Face model
// directory, or from one DiPaCo path of a `loom islands` run (--path N, or auto: the path the run's
// router sends the prompt to; the path chosen goes to stderr). Generation ends at the model's
// end-of-turn tokens (unless --ignore-eos), at a --stop string, or after --max-tokens; --chat MSG
// renders MSG through the model's chat template (infer/chat.h) and writes the reply alone. The work
// is infer/sample.h's (what is loaded, how the cache slides, the invariants); this file parses the
// flags and writes the prompt and the generated text to stdout as soon as they exist (flushed).
#include "loom/infer/sample.h"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string_view>
#include <vector>

#include "commands.h"
#include "loom/core/clock.h"
#include "loom/core/error.h"

namespace loom::cli {

namespace {

// CLI11's NonNegativeNumber prints its bound (1.8e308 in full) and lets "nan" through.

void put(std::string_view bytes) {
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), stdout) != bytes.size())
    throw Error("cannot write to stdout");
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
    std::string device, chat, dtype;
    std::vector<std::string> stop;
    bool stats = false, ignore_eos = false;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* s =
      app.add_subcommand("sample", "generate text from a trained run or a pretrained model");
  s->add_option("run_dir", o->run_dir,
                "run directory written by loom train, or a Hugging Face model directory")
      ->required();
  CLI::Option* prompt =
      s->add_option("--prompt", o->prompt, "text to continue (empty: start from a newline)");
  s->add_option("--chat", o->chat,
                "a user message, given to the model through its chat template (ChatML or Llama "
                "3's); the reply alone is written")
      ->excludes(prompt);
  s->add_option("--stop", o->stop,
                "end once the text written holds this string (repeatable; it is written)");
  s->add_flag(
      "--ignore-eos", o->ignore_eos,
      "do not end at the model's end-of-turn or end-of-text tokens (generation_config.json, "
      "tokenizer_config.json)");
  s->add_option("--max-tokens", o->max_tokens, "tokens to generate (bytes for byte-level runs)")
      ->capture_default_str()
      ->check(whole_number(0, 1 << 24));
  s->add_option("--temperature", o->temperature, "softmax temperature; 0 = greedy")
      ->capture_default_str()
      ->check(finite_number(0, INFINITY, true));
  s->add_option("--top-k", o->top_k, "sample among the k likeliest tokens; 0 = all")
      ->capture_default_str()
      ->check(whole_number(0, INT32_MAX));
  s->add_option("--seed", o->seed, "random seed (same seed, same text)")
      ->capture_default_str()
      ->check(whole_number(0, INT64_MAX));
  s->add_option("--checkpoint", o->checkpoint,
                "checkpoint directory or .safetensors (default: the run's newest checkpoint)");
  s->add_option("--context", o->context,
                "tokens of context the model sees (default: [model] max_seq_len, at most 512)")
      ->check(whole_number(1, 1 << 24));
  s->add_option("--device", o->device, "cpu or cuda (default: the run's [train] device)")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  s->add_option("--dtype", o->dtype,
                "f32 or bf16: the dtype of the matmuls (bf16: the weights rounded to bf16 once), "
                "attention and key/value cache (default: the model's [model] dtype)")
      ->check(CLI::IsMember({"f32", "bf16"}));
  s->add_option("--path", o->path,
                "DiPaCo: RUN is a loom islands run of paths; sample from path N, or auto: the "
                "one the router sends the prompt to");
  s->add_flag("--stats", o->stats,
              "print a JSON line of timings to stderr at the end: load, prompt and generation "
              "seconds and tokens/s");
  return [o]() {
    const auto t_start = std::chrono::steady_clock::now();
    const infer::Model m = infer::open_model({o->run_dir, o->checkpoint, o->path, o->prompt});
    if (m.dipaco_path >= 0)
      fmt::print(stderr, "dipaco: path {} ({})\n", m.dipaco_path, m.routed ? "routed" : "chosen");
    const double open_s = seconds_since(t_start);
    infer::SampleOptions so{o->prompt,         o->max_tokens, o->temperature, o->top_k,
                            uint64_t(o->seed), o->context,    o->device};
    so.dtype = o->dtype;
    if (!o->chat.empty()) {
      so.prompt = infer::apply_chat_template(m.chat, o->chat);
      so.echo_prompt = false;
    }
    if (!o->ignore_eos) so.stop_ids = m.chat.stop_ids;
    so.stop = o->stop;
    const infer::SampleStats st = infer::sample(m, so, put);
    if (::isatty(STDOUT_FILENO)) put("\n");  // a pipe gets exactly prompt + generated bytes
    if (o->stats) {
      // tokens_per_s counts the prompt's encoding too (as a caller waits for it), like timing a
      // whole transformers generate() call; decode_tokens_per_s the tokens after the first only
      const double gen = st.prompt_s + st.decode_s, dec = st.decode_s;
      std::fprintf(
          stderr,
          "{\"prompt_tokens\": %ld, \"new_tokens\": %ld, \"context\": %ld, "
          "\"load_s\": %.4f, \"prompt_s\": %.4f, \"generate_s\": %.4f, "
          "\"tokens_per_s\": %.3f, \"decode_tokens_per_s\": %.3f, \"stopped\": \"%s\"}\n",
          long(st.prompt_tokens), long(st.new_tokens), long(st.context), open_s + st.load_s,
          st.prompt_s, gen, gen > 0 ? double(st.new_tokens) / gen : 0.0,
          dec > 0 && st.new_tokens > 1 ? double(st.new_tokens - 1) / dec : 0.0, st.stopped.c_str());
    }
    return 0;
  };
}

}  // namespace loom::cli
