// ParamStore: the f32 master weights of a model, one contiguous buffer per parameter under its
// Hugging Face name; initialised randomly, or loaded from / saved to safetensors.
//
// Loading is strict: every model parameter must be in the weights (a .safetensors file, or a
// directory with model.safetensors or a sharded index: hf_dir.h) with exactly its shape, in F32 or
// BF16 (widened exactly), and they may hold nothing else (but a tied head equal to the embedding);
// any mismatch is a loom::Error naming the file and the tensor.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "loom/models/model.h"

namespace loom::train {

struct Config;

class ParamStore {
 public:
  explicit ParamStore(const models::ModelConfig& c);

  // normal(0, 0.02) for matrices and embeddings, 0.02/sqrt(2 L) for residual output projections,
  // ones for norm weights, zeros for biases.
  void init_random(uint64_t seed);
  void load(const std::string& path);
  // load(cfg.init_weights) for a fresh run's [model] init; a path that names nothing is an error
  // naming the config.
  void load_init(const Config& cfg);
  void save(const std::string& path) const;

  const std::vector<models::ParamInfo>& infos() const { return infos_; }
  float* data(const std::string& name);  // LOOM_CHECKs the parameter is held (not released)
  // A sharded run keeps its blocks of split parameters in its StepRunner; it can free the whole
  // copies here (release) and bring them back to gather into (restore: zeros until written).
  // load() and init_random() restore what they write.
  void release(const std::string& name);
  void restore(const std::string& name);
  const models::ParamInfo& info(const std::string& name) const;
  int64_t total_elements() const { return total_; }

 private:
  models::ModelConfig cfg_;
  std::vector<models::ParamInfo> infos_;
  std::map<std::string, std::vector<float>> buf_;
  int64_t total_ = 0;
};

}  // namespace loom::train
