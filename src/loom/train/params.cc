#include "loom/train/params.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <set>

#include "loom/core/error.h"
#include "loom/core/file.h"
#include "loom/core/safetensors.h"
#include "loom/train/config.h"
#include "loom/train/hf_dir.h"
#include "loom/train/memory.h"

namespace loom::train {

ParamStore::ParamStore(const models::ModelConfig& c) : cfg_(c), infos_(models::param_infos(c)) {
  check_params_fit(c, c.source.empty() ? "[model]" : c.source, machine_memory_bytes());
  for (const auto& p : infos_) {
    buf_[p.name].assign(size_t(numel(p.shape)), 0.0f);
    total_ += numel(p.shape);
  }
}

float* ParamStore::data(const std::string& name) {
  auto it = buf_.find(name);
  LOOM_CHECK(it != buf_.end()) << "no parameter " << name;
  LOOM_CHECK(!it->second.empty() || numel(info(name).shape) == 0)
      << "parameter " << name << " was released to a sharded runner's blocks (push_params first)";
  return it->second.data();
}

const models::ParamInfo& ParamStore::info(const std::string& name) const {
  for (const auto& p : infos_)
    if (p.name == name) return p;
  LOOM_CHECK(false) << "no parameter " << name;
  return infos_.front();
}

void ParamStore::release(const std::string& name) {
  auto it = buf_.find(name);
  LOOM_CHECK(it != buf_.end()) << "no parameter " << name;
  std::vector<float>().swap(it->second);
}

void ParamStore::restore(const std::string& name) {
  auto it = buf_.find(name);
  LOOM_CHECK(it != buf_.end()) << "no parameter " << name;
  it->second.resize(size_t(numel(info(name).shape)));
}

void ParamStore::init_random(uint64_t seed) {
  for (const auto& p : infos_) restore(p.name);
  std::mt19937_64 rng(seed);
  const double resid = 0.02 / std::sqrt(2.0 * double(cfg_.n_layers));
  for (const auto& p : infos_) {
    auto& b = buf_[p.name];
    using I = models::ParamInfo::Init;
    switch (p.init) {
      case I::ones:
        std::fill(b.begin(), b.end(), 1.0f);
        break;
      case I::zeros:
        std::fill(b.begin(), b.end(), 0.0f);
        break;
      case I::normal:
      case I::scaled_normal: {
        std::normal_distribution<double> nd(0.0, p.init == I::normal ? 0.02 : resid);
        for (float& x : b) x = float(nd(rng));
        break;
      }
    }
  }
}

void ParamStore::load(const std::string& path) {
  Weights f = Weights::open(path);
  std::set<std::string> expected;
  // Copies tensor `name` (f32, or bf16 widened exactly) into dst; a NaN or infinity in it is an
  // error naming the file, the tensor and the index (training on it would only say "loss nan").
  auto take = [&](const std::string& name, const TensorView& t, float* dst, int64_t n) {
    if (t.dtype == DType::f32)
      std::memcpy(dst, t.data, size_t(n) * sizeof(float));
    else
      std::transform(static_cast<const bf16*>(t.data), static_cast<const bf16*>(t.data) + n, dst,
                     bf16_to_f32);
    if (const int64_t i = first_nonfinite(dst, n); i >= 0)
      throw Error(fmt::format("weights {}: tensor '{}' holds {} at index {}", f.file_of(name), name,
                              dst[i], i),
                  "weights must be finite: restore the file, or resume from an earlier "
                  "checkpoint");
  };
  for (const auto& p : infos_) {
    // a stacked expert weight may come as Mixtral's one tensor per expert (loom export writes it
    // so)
    if (p.expert && !f.contains(p.name) && f.contains(models::expert_tensor_name(p.name, 0))) {
      const Shape one(p.shape.begin() + 1, p.shape.end());
      restore(p.name);
      for (int64_t e = 0; e < p.shape[0]; ++e) {
        const std::string name = models::expert_tensor_name(p.name, e);
        expected.insert(name);
        if (!f.contains(name))
          throw Error(
              fmt::format("weights {}: missing tensor '{}' for a {} model", path, name, cfg_.arch),
              "the file must hold every expert's tensors");
        const TensorView& t = f.get(name);
        if ((t.dtype != DType::f32 && t.dtype != DType::bf16) || t.shape != one)
          throw Error(fmt::format("weights {}: tensor '{}' is {}{}, the model expects f32{} (or "
                                  "bf16)",
                                  f.file_of(name), name, dtype_name(t.dtype), shape_str(t.shape),
                                  shape_str(one)),
                      "check [model] against the weights: d_model, ffn_hidden, moe");
        take(name, t, buf_[p.name].data() + e * numel(one), numel(one));
      }
      continue;
    }
    expected.insert(p.name);
    if (!f.contains(p.name))
      throw Error(
          fmt::format("weights {}: missing tensor '{}' for a {} model", path, p.name, cfg_.arch),
          "the file must hold every parameter under its Hugging Face name");
    const TensorView& t = f.get(p.name);
    if ((t.dtype != DType::f32 && t.dtype != DType::bf16) || t.shape != p.stored_shape())
      throw Error(fmt::format("weights {}: tensor '{}' is {}{}, the model expects f32{} (or bf16)",
                              f.file_of(p.name), p.name, dtype_name(t.dtype), shape_str(t.shape),
                              shape_str(p.stored_shape())),
                  "check [model] against the weights: d_model, n_heads, n_kv_heads, ffn_hidden, "
                  "vocab_size, max_seq_len");
    restore(p.name);
    take(p.name, t, buf_[p.name].data(), numel(p.shape));
  }
  for (const auto& n : f.names()) {
    if (expected.count(n)) continue;
    // A tied head saved anyway (some writers do): accepted when it is the embedding, bit for bit.
    if (cfg_.tie_embeddings && n == "lm_head.weight" &&
        expected.count("model.embed_tokens.weight")) {
      const TensorView& h = f.get(n);
      const TensorView& e = f.get("model.embed_tokens.weight");
      if (h.dtype == e.dtype && h.shape == e.shape && std::memcmp(h.data, e.data, h.nbytes) == 0)
        continue;
      throw Error(fmt::format("weights {}: 'lm_head.weight' differs from the token embedding, but "
                              "the model ties them (tie_embeddings)",
                              f.file_of(n)),
                  "set [model] tie_embeddings = false for a separate head");
    }
    throw Error(fmt::format("weights {}: unexpected tensor '{}' (not a parameter of this {} model)",
                            f.file_of(n), n, cfg_.arch),
                "check [model] in the config: n_layers, arch, tie_embeddings");
  }
}

void ParamStore::load_init(const Config& cfg) {
  std::error_code ec;
  if (!std::filesystem::exists(cfg.init_weights, ec))
    throw Error(
        fmt::format("{}: [model] init: no such file or directory {}", cfg.path, cfg.init_weights),
        "point it at a .safetensors file or a directory holding model.safetensors or "
        "model.safetensors.index.json (loom export --hf, a Hugging Face model)");
  load(cfg.init_weights);
}

void ParamStore::save(const std::string& path) const {
  std::vector<TensorToWrite> ts;
  for (const auto& p : infos_)
    ts.push_back({p.name, DType::f32, p.stored_shape(), buf_.at(p.name).data()});
  write_safetensors(path, ts);
}

}  // namespace loom::train
