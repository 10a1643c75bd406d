// loom export: a training run's weights as a Hugging Face model directory.
//
//   loom export RUN_DIR --hf OUT_DIR [--checkpoint PATH]
//
// RUN_DIR is what `loom train` wrote (config.toml, checkpoints/step_XXXXXXXX/). OUT_DIR receives
//   model.safetensors  every parameter under its Hugging Face name, f32 (Loom's names already are
//                      Hugging Face's, GPT-2's without the "transformer." prefix, as HF's own gpt2
//                      checkpoints store them; an MoE Llama's stacked expert weights become
//                      Mixtral's one tensor per expert)
//   config.json        LlamaForCausalLM, MixtralForCausalLM (an MoE Llama) or GPT2LMHeadModel, from
//                      the run's [model] (each architecture's hf_config, models/architecture.h); a
//                      model transformers has no class for (GPT-2 with MoE, NormFormer) is refused
//   tokenizer.json     the run's, when it trained on a pretrained model's tokenizer (loom data
//                      prepare --tokenizer), so the directory is a whole model again
//   tokenizer_config.json, special_tokens_map.json, chat_template.jinja, generation_config.json
//                      a run from a pretrained model ([model] init): its source's, as loom train
//                      copied them to RUN/hf/ (a generation_config.json made of the token ids
//                      where the source had none); config.json keeps the source's token ids and
//                      max_position_embeddings where that is larger than the run's max_seq_len
// so that `LlamaForCausalLM.from_pretrained(OUT_DIR)` (or GPT2LMHeadModel) loads it unchanged, and
// `[model] init = "OUT_DIR"` starts a new Loom run from it.
//
// Not done here: a tokenizer.json for byte-level or SentencePiece runs (transformers has no
// tokenizer for either as Loom uses them), bf16 or sharded output, optimizer state.
//
// OUT_DIR is this model's alone: a file of an earlier model there that this export would not
// replace (a tokenizer, a chat template, a weights shard) is refused before anything is written.
//
// Invariant: each file in OUT_DIR is either its old self or complete: both are written to a
// temporary name in OUT_DIR, fsynced and renamed into place. The weights pass through
// ParamStore::load, so a checkpoint whose tensors do not match the run's config is an error, never
// a silently bad export.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string_view>
#include <vector>

#include "commands.h"
#include "loom/core/error.h"
#include "loom/core/file.h"
#include "loom/core/safetensors.h"
#include "loom/models/architecture.h"
#include "loom/train/checkpoint.h"
#include "loom/train/config.h"
#include "loom/train/hf_dir.h"
#include "loom/train/params.h"

namespace loom::cli {

namespace fs = std::filesystem;

namespace {

// A file of a Hugging Face model directory that says what the model is: its config, weights,
// tokenizer or generation defaults.
bool describes_a_model(const std::string& name) {
  static const char* const kFiles[] = {"config.json",
                                       "model.safetensors",
                                       "model.safetensors.index.json",
                                       "tokenizer.json",
                                       "tokenizer.model",
                                       "tokenizer_config.json",
                                       "special_tokens_map.json",
                                       "generation_config.json",
                                       "chat_template.jinja",
                                       "vocab.json",
                                       "merges.txt",
                                       "added_tokens.json"};
  for (const char* f : kFiles)
    if (name == f) return true;
  return name.starts_with("model-") && name.ends_with(".safetensors");  // a shard
}

// An export directory is this model's alone: a file an earlier model left there that this export
// would not replace (its tokenizer, a shard) would describe the new weights wrongly, so the export
// is refused before anything is written.
void check_no_stale_files(const std::string& out, const std::vector<std::string>& writes) {
  std::error_code ec;
  if (!fs::is_directory(out, ec)) return;
  for (fs::directory_iterator it(out, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (describes_a_model(name) && std::find(writes.begin(), writes.end(), name) == writes.end())
      throw Error(fmt::format("--hf {}: it holds {}, an earlier model's, which this export would "
                              "not replace",
                              out, name),
                  "export into a new or empty directory, or remove that file first");
  }
  if (ec) throw Error(fmt::format("--hf {}: cannot list the directory ({})", out, ec.message()));
}

}  // namespace

std::function<int()> add_export(CLI::App& app) {
  struct Opts {
    std::string run_dir, hf, checkpoint;
  };
  auto o = std::make_shared<Opts>();
  CLI::App* s = app.add_subcommand(
      "export", "write a run's weights and config as a Hugging Face model directory");
  s->add_option("run_dir", o->run_dir, "a run directory written by loom train")->required();
  s->add_option("--hf", o->hf, "output directory: model.safetensors and config.json")->required();
  s->add_option("--checkpoint", o->checkpoint,
                "a checkpoint directory or .safetensors file (default: the run's newest)");
  return [o]() {
    train::Config cfg = train::load_run_config(o->run_dir);
    const std::string weights = train::run_weights(o->run_dir, o->checkpoint);
    train::ParamStore params(cfg.model);
    params.load(weights);  // every name, dtype and shape checked against the run's [model]

    const models::Architecture& arch = models::architecture(cfg.model.arch);
    nlohmann::ordered_json hf = arch.hf_config(cfg.model);  // refuses what HF cannot hold
    // a run from a pretrained model: what its config.json said beyond the [model] (hf_dir.h:
    // RUN/hf/ holds the source's files)
    const std::string source = o->run_dir + "/hf";
    std::error_code ec;
    if (fs::is_regular_file(source + "/config.json", ec)) {
      const nlohmann::json src = read_json(source + "/config.json");
      // the context the model was made for, though this run trained on less (RoPE: no weight
      // holds it)
      if (hf.contains("max_position_embeddings") && src.contains("max_position_embeddings") &&
          src["max_position_embeddings"].is_number_integer())
        hf["max_position_embeddings"] = std::max(hf["max_position_embeddings"].get<int64_t>(),
                                                 src["max_position_embeddings"].get<int64_t>());
      for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"})
        if (src.contains(key) && !src[key].is_null()) hf[key] = src[key];
    }
    // the files copied as they are (the run's tokenizer; the source's special tokens, chat
    // template and generation defaults): output name -> file
    std::vector<std::pair<std::string, std::string>> copies;
    if (fs::is_regular_file(o->run_dir + "/tokenizer.json", ec))
      copies.emplace_back("tokenizer.json", o->run_dir + "/tokenizer.json");
    for (const char* name : train::kHfSourceFiles)
      if (std::string_view(name) != "config.json" && fs::is_regular_file(source + "/" + name, ec))
        copies.emplace_back(name, source + "/" + name);
    // every file this export writes, checked against what the directory already holds
    std::vector<std::string> writes{"config.json", "model.safetensors"};
    for (const auto& c : copies) writes.push_back(c.first);
    const bool gen_made =
        std::find(writes.begin(), writes.end(), "generation_config.json") == writes.end() &&
        (hf.contains("bos_token_id") || hf.contains("eos_token_id") || hf.contains("pad_token_id"));
    if (gen_made) writes.push_back("generation_config.json");
    check_no_stale_files(o->hf, writes);
    fs::create_directories(o->hf, ec);
    if (ec || !fs::is_directory(o->hf))
      throw Error(fmt::format("--hf {}: cannot create the directory ({})", o->hf,
                              ec ? ec.message() : "a file is in the way"),
                  "choose a writable output directory");
    // before anything is written: no target is a directory or device (nothing half-written),
    // nor the weights this export reads
    for (const std::string& w : writes)
      check_output("--hf", o->hf + "/" + w, {{"run_dir", weights}});
    const std::string model_out = o->hf + "/model.safetensors";
    // every parameter under its Hugging Face name; a stacked expert weight as one tensor per
    // expert (Mixtral's layout)
    std::vector<TensorToWrite> tensors;
    for (const auto& p : params.infos()) {
      const float* d = params.data(p.name);
      if (!p.expert) {
        tensors.push_back({p.name, DType::f32, p.stored_shape(), d});
        continue;
      }
      const Shape one(p.shape.begin() + 1, p.shape.end());
      for (int64_t e = 0; e < p.shape[0]; ++e)
        tensors.push_back(
            {models::expert_tensor_name(p.name, e), DType::f32, one, d + e * numel(one)});
    }
    write_safetensors(model_out, tensors);  // atomic: MODEL.tmp.<pid>, fsynced, renamed
    write_file_atomic(o->hf + "/config.json", hf.dump(2) + "\n");
    for (const auto& [name, from] : copies) write_file_atomic(o->hf + "/" + name, read_file(from));
    // generation defaults where the source had none: its token ids (transformers' own fallback)
    if (gen_made) {
      nlohmann::ordered_json gen;
      for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"})
        if (hf.contains(key)) gen[key] = hf[key];
      write_file_atomic(o->hf + "/generation_config.json", gen.dump(2) + "\n");
    }
    fmt::print("exported {} ({} {}, {} parameters) to {}\n", weights, cfg.model.arch,
               hf["architectures"][0].get<std::string>(), params.total_elements(), o->hf);
    return 0;
  };
}

}  // namespace loom::cli
