#include "loom/train/hf_dir.h"

#include <fmt/format.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "loom/config/schema.h"
#include "loom/core/error.h"
#include "loom/core/file.h"
#include "loom/models/architecture.h"

namespace loom::train {

namespace fs = std::filesystem;

bool is_hf_dir(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::is_regular_file(fs::path(path) / "config.json", ec);
}

models::ModelConfig read_hf_model(const std::string& dir) {
  const std::string file = (fs::path(dir) / "config.json").string();
  return models::model_from_hf(read_json(file), file);
}

Weights Weights::open(const std::string& path) {
  std::error_code ec;
  Weights w;
  w.path_ = path;
  auto add = [&](SafetensorsFile f) {
    for (const auto& n : f.names()) {
      if (w.where_.count(n))
        throw Error(fmt::format("weights {}: tensor '{}' is in both {} and {}", path, n,
                                w.files_[w.where_[n]].path(), f.path()));
      w.where_[n] = w.files_.size();
      w.names_.push_back(n);
    }
    w.files_.push_back(std::move(f));
  };
  if (fs::is_regular_file(path, ec)) {
    add(SafetensorsFile::open(path));
    return w;
  }
  if (!fs::is_directory(path, ec))
    throw Error(fmt::format("weights {}: {}", path,
                            fs::exists(path, ec) ? "not a regular file (nor a directory)"
                                                 : "no such file or directory"),
                "point it at a .safetensors file, or a directory holding model.safetensors or "
                "model.safetensors.index.json (loom export --hf, transformers' save_pretrained)");
  const fs::path single = fs::path(path) / "model.safetensors";
  const fs::path index = fs::path(path) / "model.safetensors.index.json";
  if (fs::is_regular_file(single, ec)) {
    add(SafetensorsFile::open(single.string()));
    return w;
  }
  if (is_sharded_checkpoint(path)) return sharded(path, "model");
  if (!fs::is_regular_file(index, ec))
    throw Error(fmt::format("weights {}: the directory holds neither model.safetensors nor "
                            "model.safetensors.index.json",
                            path),
                "point it at loom export --hf's output, a checkpoint (whole or sharded), or a "
                "Hugging Face model directory");
  const std::string ifile = index.string();
  nlohmann::json j = read_json(ifile);
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    throw Error(fmt::format("{}: no \"weight_map\" object", ifile),
                "a sharded checkpoint's index maps each tensor to its shard file");
  // shard file -> the tensors the index says it holds
  std::map<std::string, std::set<std::string>> shards;
  for (const auto& [tensor, file] : j["weight_map"].items()) {
    if (!file.is_string())
      throw Error(fmt::format("{}: weight_map[\"{}\"] is not a file name", ifile, tensor));
    const std::string f = file.get<std::string>();
    if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..")
      throw Error(fmt::format("{}: weight_map[\"{}\"] = \"{}\" is not a file in {}", ifile, tensor,
                              f, path));
    shards[f].insert(tensor);
  }
  if (shards.empty()) throw Error(fmt::format("{}: weight_map is empty", ifile));
  for (const auto& [file, tensors] : shards) {
    const fs::path shard = fs::path(path) / file;
    if (!fs::is_regular_file(shard, ec))
      throw Error(fmt::format("{}: shard {} is missing (it holds {} tensors, e.g. '{}')", ifile,
                              shard.string(), tensors.size(), *tensors.begin()),
                  "copy every shard the index names into the directory");
    SafetensorsFile f = SafetensorsFile::open(shard.string());
    for (const auto& t : tensors)
      if (!f.contains(t))
        throw Error(fmt::format("{}: tensor '{}' is listed in {} but {} does not hold it",
                                shard.string(), t, ifile, file));
    for (const auto& n : f.names())
      if (!tensors.count(n))
        throw Error(
            fmt::format("{}: tensor '{}' is not in {}'s weight_map", shard.string(), n, ifile));
    add(std::move(f));
  }
  return w;
}

Weights Weights::sharded(const std::string& dir, const std::string& part) {
  Weights w;
  w.path_ = dir;
  w.sharded_ = ShardedCheckpoint::open(dir, part);
  w.names_ = w.sharded_->names();
  return w;
}

const TensorView& Weights::get(const std::string& name) const {
  if (sharded_) return sharded_->get(name);
  auto it = where_.find(name);
  if (it == where_.end()) throw Error(fmt::format("weights {}: no tensor '{}'", path_, name));
  return files_[it->second].get(name);
}

const std::string& Weights::file_of(const std::string& name) const {
  if (sharded_) return sharded_->index_path();
  auto it = where_.find(name);
  return it == where_.end() ? path_ : files_[it->second].path();
}

void copy_hf_source_files(const std::string& from, const std::string& to) {
  make_directories(to);
  for (const char* name : kHfSourceFiles)
    if (const std::string f = from + "/" + name; path_exists(f))
      write_file_atomic(to + "/" + name, read_file(f));
}

void merge_hf_model(toml::table& root, const std::string& path) {
  toml::table* model = root["model"].as_table();
  if (!model) return;
  auto init = (*model)["init"].value<std::string>();
  if (!init || !is_hf_dir(*init)) return;
  const models::ModelConfig h = read_hf_model(*init);
  const toml::table from_hf{{"arch", h.arch},
                            {"vocab_size", h.vocab_size},
                            {"d_model", h.d_model},
                            {"n_layers", h.n_layers},
                            {"n_heads", h.n_heads},
                            {"n_kv_heads", h.n_kv_heads},
                            {"ffn_hidden", h.ffn_hidden},
                            {"max_seq_len", h.max_seq_len},
                            {"norm_eps", h.norm_eps},
                            {"rope_theta", h.rope_theta},
                            {"tie_embeddings", h.tie_embeddings}};
  for (const auto& [k, v] : from_hf) {
    const std::string key(k.str());
    const toml::node* mine = model->get(key);
    // absent, or 0 for the two keys where 0 means "the default": config.json's value
    if (!mine || ((key == "ffn_hidden" || key == "n_kv_heads") && config::integer_in(*mine) == 0)) {
      model->insert_or_assign(key, v);
      continue;
    }
    bool same = true;
    if (auto s = v.value<std::string>())
      same = mine->value<std::string>() == s;
    else if (auto b = v.value<bool>(); v.is_boolean())
      same = mine->value<bool>() == b;
    else if (auto x = mine->value<double>())
      same = key == "max_seq_len" ? *x <= *v.value<double>() : *x == *v.value<double>();
    if (!same) {
      std::ostringstream theirs, ours;
      v.visit([&](const auto& x) { theirs << x; });
      mine->visit([&](const auto& x) { ours << x; });
      throw Error(fmt::format("{}: [model] {} = {} disagrees with {}/config.json, which gives {}",
                              path, key, ours.str(), *init, theirs.str()),
                  "[model] init names a Hugging Face directory, whose config.json decides the "
                  "model: drop the key from [model] (only max_seq_len may be lower)");
    }
  }
}

}  // namespace loom::train
