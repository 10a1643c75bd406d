// DecodeRunner: incremental decoding with a key/value cache, what loom sample runs. Tokens are fed
// in order; each layer's keys and values stay in caches of `cache_len` positions between calls, so
// a new token costs one position's forward (its matmuls, and attention over the cache) instead of a
// forward over the whole context.
//
// A call feeds n tokens as power-of-two chunks (37 = 32 + 4 + 1), each chunk one decode-step graph
// (passes::StepKind::decode, compiled on first use and kept: at most log2(cache_len) + 1 of them,
// sharing the caches and the ParamStore.s weights). The prompt goes in as one call, then each new
// token as a call of one.
//
// Worked example, cache_len 8, prompt "abcde": feed(abcde) runs the 4-token graph at position 0
// (the flash kernel, the cache empty) and the 1-token graph at position 4, returning the logits
// after "e"; feed(f) runs the 1-token graph at 5. At position 8 the cache is full: the caller
// resets and feeds the tokens it wants to keep.
//
// On a GPU (`device`), the weights are copied there once, the caches live there, and a call sends
// its tokens up and brings the logits down. Under [model] dtype = "bf16" the matmuls read bf16
// copies of their weights, rounded once here from the f32 masters (the bits a training step's cast
// makes), so a token reads half the bytes of f32 weights and no cast runs per token; the caches
// hold bf16 keys and values.
//
// Not here: sampling and the generation loop (sample.h), batches of several sequences (B = 1), a
// plan (one process). Invariant: the logits after feeding tokens t_0..t_k equal the full forward's
// at position k (decode_test checks every position, chunked or not), up to the rounding of a
// different attention summation order.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "loom/models/model.h"
#include "loom/passes/pipeline.h"
#include "loom/runtime/executor.h"
#include "loom/train/params.h"

namespace loom::infer {

class DecodeRunner {
 public:
  // cache_len: positions the caches hold, 1..[model] max_seq_len. source names the model in errors.
  // Throws loom::Error for a model or cache length that cannot be compiled.
  DecodeRunner(const models::ModelConfig& model, train::ParamStore& params, int64_t cache_len,
               std::string source, runtime::Device& device = runtime::cpu_device());
  ~DecodeRunner();
  DecodeRunner(const DecodeRunner&) = delete;
  DecodeRunner& operator=(const DecodeRunner&) = delete;

  // Appends n >= 1 tokens at positions position()..position()+n-1; returns the logits (vocab())
  // after the last, valid until the next call. Throws loom::Error when they do not fit in the cache
  // (position() + n > capacity()) or for a token id outside the vocabulary; after a throw, reset().
  const float* feed(const int32_t* tokens, int64_t n);
  // Empties the cache: the next token is at position 0.
  void reset() { pos_ = 0; }
  int64_t position() const { return pos_; }
  int64_t capacity() const { return cache_len_; }
  int64_t vocab() const { return model_.vocab_size; }

 private:
  struct Step {  // one decode-step graph of n tokens, bound and ready
    passes::Compilation c;
    std::unique_ptr<runtime::Executor> exec;
    std::vector<int32_t> tokens;
    int32_t start = 0;
    runtime::Buffer dev_tokens, dev_start;  // on a GPU: where the executor reads them
    std::vector<float> logits;              // on a GPU: the logits, brought down
  };
  models::ModelConfig model_;
  train::ParamStore& params_;
  int64_t cache_len_;
  std::string source_;
  int64_t pos_ = 0;
  std::map<int64_t, Step> steps_;  // by tokens per step
  runtime::Device& dev_;
  std::map<std::string, runtime::Buffer> caches_;  // by state name: layers.0.k_cache, ...
  // by name: on a GPU, the parameters' copies; under bf16, the weights' bf16 copies (model.h:
  // ModelGraph::weight_copies)
  std::map<std::string, runtime::Buffer> weights_;
  Step& step_for(int64_t n);
};

}  // namespace loom::infer
