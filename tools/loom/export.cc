// loom export: a training run's weights as a Hugging Face model directory.
//
//   loom export RUN_DIR --hf OUT_DIR [--checkpoint PATH]
//
// RUN_DIR is what `loom train` wrote (config.toml, checkpoints/step_XXXXXXXX/). OUT_DIR receives
//   model.safetensors  every parameter under its Hugging Face name, f32 (Loom's names already are
//                      Hugging Face's, GPT-2's without the "transformer." prefix, as HF's own gpt2
//                      checkpoints store them)
//   config.json        LlamaForCausalLM or GPT2LMHeadModel, from the run's [model]
// so that `LlamaForCausalLM.from_pretrained(OUT_DIR)` (or GPT2LMHeadModel) loads it unchanged, and
// `[model] init = "OUT_DIR"` starts a new Loom run from it.
//
// Not done here: tokenizer files (Loom's tokens are bytes; there is no tokenizer.json to write), bf16
// or sharded output, optimizer state.
//
// Invariant: each file in OUT_DIR is either its old self or complete: both are written to a temporary
// name in OUT_DIR, fsynced and renamed into place. The weights pass through ParamStore::load, so a
// checkpoint whose tensors do not match the run's config is an error, never a silently bad export.
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "loom/core/error.h"
#include "loom/train/checkpoint.h"
#include "loom/train/config.h"
#include "loom/train/params.h"

namespace loom::cli {

namespace fs = std::filesystem;

namespace {

// The Hugging Face config.json for `m`. Keys follow transformers' LlamaConfig / GPT2Config; what is
// left out takes HF's default, which matches Loom (no attention or MLP biases in Llama, GPT-2's
// attention scaled by 1/sqrt(head size)). Dropout defaults are irrelevant at inference.
nlohmann::ordered_json hf_config(const models::ModelConfig& m) {
  if (m.arch == "llama")
    return {{"architectures", {"LlamaForCausalLM"}},
            {"model_type", "llama"},
            {"vocab_size", m.vocab_size},
            {"hidden_size", m.d_model},
            {"intermediate_size", m.ffn()},
            {"num_hidden_layers", m.n_layers},
            {"num_attention_heads", m.n_heads},
            {"num_key_value_heads", m.kv_heads()},
            {"max_position_embeddings", m.max_seq_len},
            {"rms_norm_eps", m.norm_eps},
            {"rope_theta", m.rope_theta},
            {"hidden_act", "silu"},
            {"tie_word_embeddings", false},  // Loom's lm_head is its own parameter
            {"torch_dtype", "float32"}};
  LOOM_CHECK(m.arch == "gpt2") << "validated arch " << m.arch;
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"vocab_size", m.vocab_size},
          {"n_embd", m.d_model},
          {"n_layer", m.n_layers},
          {"n_head", m.n_heads},
          {"n_positions", m.max_seq_len},
          {"n_inner", m.ffn()},
          {"layer_norm_epsilon", m.norm_eps},
          {"activation_function", "gelu_new"},  // GELU, tanh approximation
          {"tie_word_embeddings", true},        // the logits are ln_f(x) @ wte^T
          {"torch_dtype", "float32"}};
}

// Writes `text` to `path` atomically: DIR/.tmp.NAME.<pid>, fsynced, renamed over `path`, DIR fsynced.
// On failure the temporary file is removed and a loom::Error names the path and the OS error.
void write_text_atomic(const std::string& path, const std::string& text) {
  const fs::path p(path);
  const std::string dir = p.parent_path().empty() ? "." : p.parent_path().string();
  const std::string tmp =
      (fs::path(dir) / fmt::format(".tmp.{}.{}", p.filename().string(), ::getpid())).string();
  auto fail = [&](const std::string& what, int e) {
    ::unlink(tmp.c_str());
    throw Error(fmt::format("cannot {} {}: {}", what, path, std::strerror(e)),
                e == ENOSPC ? "the disk is full; free space and export again" : "");
  };
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail("create a temporary file for", errno);
  for (size_t done = 0; done < text.size();) {
    ssize_t w = ::write(fd, text.data() + done, text.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      int e = w < 0 ? errno : EIO;
      ::close(fd);
      fail("write", e);
    }
    done += size_t(w);
  }
  if (::fsync(fd) != 0) {
    int e = errno;
    ::close(fd);
    fail("fsync", e);
  }
  if (::close(fd) != 0) fail("close", errno);
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail("rename a temporary file onto", errno);
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0 || ::fsync(dfd) != 0) {
    int e = errno;
    if (dfd >= 0) ::close(dfd);
    throw Error(fmt::format("cannot fsync directory {}: {}", dir, std::strerror(e)));
  }
  ::close(dfd);
}

// The weights file to export: --checkpoint (a step_* directory or a .safetensors file), else the
// newest complete checkpoint of the run.
std::string weights_path(const std::string& run, const std::string& checkpoint) {
  std::error_code ec;
  if (!checkpoint.empty()) {
    std::string w = fs::is_directory(checkpoint, ec) ? checkpoint + "/model.safetensors" : checkpoint;
    if (!fs::is_regular_file(w, ec))
      throw Error(fmt::format("--checkpoint {}: no such file", w),
                  "pass a checkpoint directory (RUN_DIR/checkpoints/step_XXXXXXXX) or its "
                  "model.safetensors");
    return w;
  }
  const std::string ckdir = run + "/checkpoints";
  auto latest = train::latest_checkpoint(ckdir);
  if (!latest)
    throw Error(fmt::format("run dir {}: no checkpoints in {}", run, ckdir),
                "train it first (loom train CONFIG --run-dir RUN_DIR), or pass --checkpoint PATH");
  return *latest + "/model.safetensors";
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
    std::error_code ec;
    const std::string cfg_path = o->run_dir + "/config.toml";
    if (!fs::is_directory(o->run_dir, ec))
      throw Error(fmt::format("run dir {}: not a directory", o->run_dir),
                  "pass the directory loom train wrote (its --run-dir, default runs/<config>)");
    if (!fs::is_regular_file(cfg_path, ec))
      throw Error(fmt::format("run dir {}: no config.toml", o->run_dir),
                  "pass the directory loom train wrote (its --run-dir, default runs/<config>)");
    train::Config cfg = train::load_config(cfg_path);
    const std::string weights = weights_path(o->run_dir, o->checkpoint);
    train::ParamStore params(cfg.model);
    params.load(weights);  // every name, dtype and shape checked against the run's [model]

    fs::create_directories(o->hf, ec);
    if (ec || !fs::is_directory(o->hf))
      throw Error(fmt::format("--hf {}: cannot create the directory ({})", o->hf,
                              ec ? ec.message() : "a file is in the way"),
                  "choose a writable output directory");
    const std::string model_out = o->hf + "/model.safetensors";
    params.save(model_out);  // atomic: MODEL.tmp.<pid>, fsynced, renamed
    write_text_atomic(o->hf + "/config.json", hf_config(cfg.model).dump(2) + "\n");
    fmt::print("exported {} ({} {}, {} parameters) to {}\n", weights, cfg.model.arch,
               cfg.model.arch == "llama" ? "LlamaForCausalLM" : "GPT2LMHeadModel",
               params.total_elements(), o->hf);
    return 0;
  };
}

}  // namespace loom::cli
