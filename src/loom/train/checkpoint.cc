#include "loom/train/checkpoint.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "loom/core/checksum.h"
#include "loom/core/error.h"
#include "loom/core/file.h"
#include "loom/core/safetensors.h"
#include "loom/train/hf_dir.h"
#include "loom/train/sharded_checkpoint.h"

namespace loom::train {

namespace fs = std::filesystem;

int64_t checkpoint_step(const std::string& name) {
  if (name.rfind("step_", 0) != 0 || name.size() <= 5) return -1;
  int64_t s = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(name[i]))) return -1;
    s = s * 10 + (name[i] - '0');
  }
  return s;
}

std::string checkpoint_name(int64_t step) { return fmt::format("step_{:08d}", step); }

std::vector<std::string> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return {};
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    int64_t s = checkpoint_step(e.path().filename().string());
    if (s >= 0 && e.is_directory()) found.push_back({s, e.path().string()});
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> r;
  for (auto& [s, p] : found) r.push_back(p);
  return r;
}

std::optional<std::string> latest_checkpoint(const std::string& dir) {
  auto all = list_checkpoints(dir);
  if (all.empty()) return std::nullopt;
  return all.back();
}

Config load_run_config(const std::string& run_dir) {
  std::error_code ec;
  const std::string hint =
      "pass the directory loom train wrote (its --run-dir, default runs/<config>)";
  if (!fs::is_directory(run_dir, ec))
    throw Error(fmt::format("run dir {}: not a directory", run_dir), hint);
  const std::string config = run_dir + "/config.toml";
  if (!fs::is_regular_file(config, ec))
    throw Error(fmt::format("run dir {}: no config.toml", run_dir), hint);
  return load_config(config);
}

std::optional<std::string> model_file(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec) && is_sharded_checkpoint(path)) return path;
  std::string f = fs::is_directory(path, ec) ? path + "/model.safetensors" : path;
  if (!fs::is_regular_file(f, ec)) return std::nullopt;
  return f;
}

std::string run_weights(const std::string& run_dir, const std::string& choice) {
  if (!choice.empty()) {
    if (auto f = model_file(choice)) return *f;
    struct stat st {};
    const bool there = ::stat(choice.c_str(), &st) == 0;
    throw Error(fmt::format("--checkpoint {}: {}", choice,
                            !there ? "no such file, nor a directory holding model.safetensors"
                            : S_ISDIR(st.st_mode)
                                ? "a directory holding no model.safetensors"
                                : fmt::format("not a regular file ({})", file_kind(st.st_mode))),
                "pass a checkpoint directory (RUN_DIR/checkpoints/step_XXXXXXXX) or a .safetensors "
                "file");
  }
  const std::string ckdir = run_dir + "/checkpoints";
  auto latest = latest_checkpoint(ckdir);
  if (!latest)
    throw Error(fmt::format("run dir {}: no checkpoints in {}", run_dir, ckdir),
                "train it first (loom train CONFIG --run-dir RUN_DIR), or pass --checkpoint PATH");
  return is_sharded_checkpoint(*latest) ? *latest : *latest + "/model.safetensors";
}

namespace {

// A file of checkpoint `path`, whole; an unreadable one is an error naming the checkpoint.
std::string read_checkpoint_file(const std::string& path, const std::string& name) {
  try {
    return read_file(path + "/" + name);
  } catch (const Error& e) {
    throw Error(fmt::format("checkpoint {}: cannot read {}: {}", path, name, e.what()));
  }
}

}  // namespace

nlohmann::json read_checkpoint_state(const std::string& path) {
  const std::string state_path = path + "/state.json";
  const std::string in = read_checkpoint_file(path, "state.json");
  nlohmann::json st;
  try {
    st = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("checkpoint {}: state.json is corrupt ({})", state_path, e.what()));
  }
  if (!st.is_object() || !st.contains("step") || !st["step"].is_number_integer() ||
      !st.contains("format") || st["format"] != 1)
    throw Error(
        fmt::format("checkpoint {}: state.json lacks an integer 'step' or format 1", state_path));
  // the step: a count the run can reach, and the one its directory is named for
  const int64_t step = st["step"].get<int64_t>();
  const int64_t named = checkpoint_step(fs::path(path).filename().string());
  if (step < 0 || step > (int64_t(1) << 40) || (named >= 0 && named != step))
    throw Error(fmt::format("checkpoint {}: state.json's step {} is not {}", state_path, step,
                            named >= 0 ? fmt::format("its directory's ({})", named)
                                       : std::string("in [0, 2^40]")),
                "resume from an earlier checkpoint");
  // the checksums save_checkpoint records (older checkpoints have none)
  if (st.contains("crc32")) {
    nlohmann::json rest = st;
    rest.erase("crc32");
    if (!st["crc32"].is_string() || st["crc32"].get<std::string>() != crc32_hex(rest.dump()))
      throw Error(fmt::format("checkpoint {}: state.json fails its checksum: the file is damaged",
                              state_path),
                  "resume from an earlier checkpoint");
  }
  if (st.contains("config_crc32")) {
    const std::string config_path = path + "/config.toml";
    const std::string text = read_checkpoint_file(path, "config.toml");
    if (!st["config_crc32"].is_string() || st["config_crc32"].get<std::string>() != crc32_hex(text))
      throw Error(fmt::format("checkpoint {}: config.toml fails the checksum state.json records: "
                              "the file is damaged",
                              config_path),
                  "resume from an earlier checkpoint");
  }
  return st;
}

namespace {

// A sharded run from a sharded checkpoint: each rank reads its own blocks of every parameter and
// moment (ShardedCheckpoint::read_block), under whatever plan it runs, straight into the runner's
// memory; no tensor it splits is assembled whole.
void load_blocks(const std::string& path, StepRunner& runner) {
  const auto model = ShardedCheckpoint::open(path, "model");
  const auto opt = ShardedCheckpoint::open(path, "optimizer");
  const int64_t rank = runner.world().rank();
  for (const HeldTensor& t : runner.held_tensors()) {
    const ShardedCheckpoint& ck = t.part == "model" ? *model : *opt;
    if (!ck.contains(t.name))
      throw Error(
          fmt::format("checkpoint {}: {} has no tensor '{}'", path, ck.index_path(), t.name),
          "check [model] against the checkpoint's config.toml");
    if (ck.grid(t.name) != t.grid)
      throw Error(
          fmt::format("checkpoint {}: tensor '{}' is {} in {}, the model's is {}", path, t.name,
                      shape_str(ck.grid(t.name)), ck.index_path(), shape_str(t.grid)),
          "check [model] against the checkpoint's config.toml");
    ck.read_block(t.name, t.sharding, runner.mesh(), rank, t.data);
    const int64_t n = numel(shard::local_shape(t.grid, t.sharding, runner.mesh()));
    if (const int64_t i = first_nonfinite(t.data, n); i >= 0)
      throw Error(fmt::format("checkpoint {}: tensor '{}' holds {} in rank {}'s block (at {})",
                              path, t.name, t.data[i], rank, i),
                  "resume from an earlier checkpoint");
  }
}

}  // namespace

nlohmann::json load_checkpoint(const std::string& path, ParamStore& params, StepRunner& runner) {
  const nlohmann::json st = read_checkpoint_state(path);
  if (runner.sharded() && is_sharded_checkpoint(path)) {
    load_blocks(path, runner);
    runner.set_step_count(st["step"].get<int64_t>());
    return st;
  }
  // a sharded checkpoint's tensors, parameters and moments, are assembled from its rank files
  const bool sharded = is_sharded_checkpoint(path);
  params.load(sharded ? path : path + "/model.safetensors");
  runner.pull_params();
  const std::string opt_path = sharded ? path : path + "/optimizer.safetensors";
  const Weights opt = sharded ? Weights::sharded(path, "optimizer") : Weights::open(opt_path);
  for (const auto& p : params.infos())
    for (autodiff::Moment which : autodiff::kMoments) {
      std::string name = autodiff::moment_state_name(which, p.name);
      if (!opt.contains(name))
        throw Error(fmt::format("checkpoint {}: missing tensor '{}'", opt.file_of(name), name));
      const TensorView& t = opt.get(name);
      if (t.dtype != DType::f32 || t.shape != p.stored_shape())
        throw Error(fmt::format("checkpoint {}: tensor '{}' is {}{}, expected f32{}",
                                opt.file_of(name), name, dtype_name(t.dtype), shape_str(t.shape),
                                shape_str(p.stored_shape())));
      const float* m = static_cast<const float*>(t.data);
      if (const int64_t i = first_nonfinite(m, numel(p.shape)); i >= 0)
        throw Error(fmt::format("checkpoint {}: tensor '{}' holds {} at index {}",
                                opt.file_of(name), name, m[i], i),
                    "resume from an earlier checkpoint");
      runner.write_moment(p.name, which, m);
    }
  runner.set_step_count(st["step"].get<int64_t>());
  return st;
}

}  // namespace loom::train
