// Sampling: text generated from a run that `loom train` wrote, from a Hugging Face model directory
// (config.json, weights, tokenizer.json), or from one DiPaCo path of a `loom islands` run — the
// front door of `loom sample`, which only parses flags and prints.
//
// open_model() resolves what to load. Tokens are bytes (id = byte value) unless the run trained on
// a `loom data prepare` directory with a tokenizer: then the prompt is encoded and the output
// decoded with RUN/tokenizer.model or tokenizer.json (copied there by loom train), else with the
// one in the run's [data] path, else its [model] init directory's tokenizer.json.
//
// sample() runs a DecodeRunner (decode.h) with a key/value cache of T = context positions (default:
// the model's max_seq_len, at most 512). The prompt (its last T tokens) is fed once; then each new
// token is fed alone, at the cost of one position's forward plus attention over the cache. When the
// cache is full, the newest T/2 tokens (at least one) are kept and fed again from position 0, so
// the model always sees between T/2 and T tokens of context. Worked example, T = 4, prompt "ab":
// feed "ab" (positions 0-1) -> c; feed c (2) -> d; feed d (3) -> e; the cache is full: keep "de",
// feed it at 0-1 -> f; feed f (2) ...
//
// The prompt and then the generated text go to `out` as soon as they exist, so with bytes the
// caller sees exactly prompt + max_tokens bytes; with BPE, an incomplete UTF-8 character (from
// byte-fallback pieces) is held back until it completes or generation ends.
//
// Invariant: the output is a function of (weights, prompt, options) alone; a given seed gives the
// same bytes every run. With bytes, sampling draws only from the 256 byte tokens (a larger
// vocabulary's extra ids are never trained on byte-level text and could not be written as bytes);
// with a tokenizer, from its whole vocabulary.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "loom/infer/chat.h"
#include "loom/tokenizer/tokenizer.h"
#include "loom/train/config.h"

namespace loom::infer {

struct ModelSource {
  std::string run;         // a run directory, a Hugging Face model directory, or a DiPaCo run
  std::string checkpoint;  // a checkpoint directory or .safetensors; empty: the newest
  std::string path;        // DiPaCo: "auto" (routed by the prompt) or a path index; empty: none
  std::string prompt;      // what "auto" routes
};

// What sample() loads: a model, its weights and its tokenizer, checked against one another.
struct Model {
  train::Config cfg;
  std::string config;   // the file the [model] came from, for messages
  std::string weights;  // the weights file or checkpoint
  data::Tokenizer tok = data::Tokenizer::byte_level();
  int64_t dipaco_path = -1;  // the DiPaCo path chosen, or -1
  bool routed = false;       // ... by the router
  // the ids that end a reply and the chat template (chat.h): from a Hugging Face directory's own
  // files, or those a run copied from its [model] init directory (RUN/hf/), else that directory's
  ChatFiles chat;
};

// Throws loom::Error naming the file for a run that cannot be sampled from: no weights, a tokenizer
// whose vocabulary does not match the model, a byte-level model below 256 tokens, a DiPaCo spec
// naming no path.
Model open_model(const ModelSource& s);

struct SampleOptions {
  std::string prompt;  // empty: start from a newline
  int64_t max_tokens = 200;
  double temperature = 0.8;  // 0: greedy
  int64_t top_k = 40;        // 0: all
  uint64_t seed = 0;
  int64_t context = 0;  // tokens of context; 0: [model] max_seq_len, at most 512
  std::string device;   // "cpu" or "cuda"; empty: the run's [train] device
  // "f32" or "bf16": the matmuls', attention's and key/value cache's dtype (bf16: the weights'
  // bf16 copies, decode.h); empty: the model's [model] dtype
  std::string dtype;
  // Generation also ends at a token of stop_ids (not written: the model's end of turn) or once the
  // text it wrote holds one of `stop` (written, as transformers' stop_strings leave it).
  std::vector<int32_t> stop_ids;
  std::vector<std::string> stop;
  bool echo_prompt = true;  // write the prompt before the text (not for a chat's rendered turn)
};

struct SampleStats {
  int64_t prompt_tokens = 0, new_tokens = 0, context = 0;
  std::string stopped = "max_tokens";  // or "stop_id", "stop_string"
  double load_s = 0;                   // weights loaded, decoder compiled
  double prompt_s = 0;                 // the prompt fed
  double decode_s = 0;                 // every token after the first
};

// Generates up to o.max_tokens tokens after o.prompt, writing the prompt and then the text through
// `out`.
// Throws loom::Error when the logits are not finite (a corrupt checkpoint or a diverged run).
SampleStats sample(const Model& m, const SampleOptions& o,
                   const std::function<void(std::string_view)>& out);

}  // namespace loom::infer
