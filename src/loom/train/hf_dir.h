// Hugging Face model directories as Loom reads them: the form transformers' save_pretrained and
// `loom export --hf` write, a config.json beside the weights, which are either one
// model.safetensors or shards listed by model.safetensors.index.json ({"weight_map": {tensor:
// shard file}}).
//
// A directory with a config.json given as [model] init decides the model: load_config takes the
// [model] keys from it (models::model_from_hf; a key the config also sets must agree), and the
// weights are read through Weights. Every problem (a missing shard, a tensor the index lists but
// its shard lacks, a truncated file, an unsupported field) is a loom::Error naming the file and
// the tensor or field.
//
// Not here: F16 or quantised tensors (safetensors.h names them as unsupported; convert to f32 or
// bf16 first), lazy loading (each shard is read whole).
#pragma once

#include <toml++/toml.h>

#include <map>
#include <string>
#include <vector>

#include "loom/core/safetensors.h"
#include "loom/models/model.h"
#include "loom/train/sharded_checkpoint.h"

namespace loom::train {

// `path` is a directory holding a config.json.
bool is_hf_dir(const std::string& path);
// A pretrained model's files beside its weights that say how it is used: its config.json, the
// tokenizer's configuration (special tokens, chat template), generation defaults.
inline constexpr const char* kHfSourceFiles[] = {"config.json", "tokenizer_config.json",
                                                 "special_tokens_map.json",
                                                 "generation_config.json", "chat_template.jinja"};
// Copies those of kHfSourceFiles that `from` has into `to` (made if absent; each file written
// atomically). Throws loom::Error naming the file that cannot be read or written.
void copy_hf_source_files(const std::string& from, const std::string& to);
// The [model] that `dir`/config.json describes. Throws naming the file and field.
models::ModelConfig read_hf_model(const std::string& dir);

// Named tensors from one .safetensors file, or from a directory holding model.safetensors,
// model.safetensors.index.json with its shards, or a sharded checkpoint's index.json with its rank
// files (sharded_checkpoint.h: each tensor assembled whole from its blocks).
class Weights {
 public:
  // Throws loom::Error naming `path` when it is none of the above, or naming the index, a shard or
  // a tensor when they disagree.
  static Weights open(const std::string& path);
  // Part "model" or "optimizer" of the sharded checkpoint in `dir` (sharded_checkpoint.h).
  static Weights sharded(const std::string& dir, const std::string& part);

  bool contains(const std::string& name) const {
    return sharded_ ? sharded_->contains(name) : where_.count(name) > 0;
  }
  // Throws naming the tensor when absent.
  const TensorView& get(const std::string& name) const;
  // The file that holds `name` (for messages).
  const std::string& file_of(const std::string& name) const;
  // Every tensor name, file by file.
  const std::vector<std::string>& names() const { return names_; }
  // What was opened: the file, or the directory.
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t> where_;  // tensor -> index into files_
  std::vector<std::string> names_;
  std::shared_ptr<const ShardedCheckpoint> sharded_;
};

// [model] init naming a Hugging Face directory decides the model: its config.json's keys fill the
// config's [model] in `root` (read from `path`); a key the config also sets must agree
// (max_seq_len may be lower). The keys land in `root`, so a run's saved config.toml holds the
// whole model and a resume needs no config.json.
void merge_hf_model(toml::table& root, const std::string& path);

}  // namespace loom::train
