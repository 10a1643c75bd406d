#include "loom/train/checkpoint.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "loom/core/error.h"
#include "loom/core/safetensors.h"

namespace loom::train {

namespace fs = std::filesystem;

namespace {

// Writes `text` to `path` and fsyncs it; throws naming the path and the OS error.
void write_file_synced(const std::string& path, const std::string& text) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(fmt::format("cannot create {}: {}", path, std::strerror(errno)));
  size_t done = 0;
  while (done < text.size()) {
    ssize_t w = ::write(fd, text.data() + done, text.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      int e = errno;
      ::close(fd);
      throw Error(fmt::format("cannot write {}: {}", path, std::strerror(e)),
                  e == ENOSPC ? "the disk is full; free space and resume from the last checkpoint"
                              : "");
    }
    done += size_t(w);
  }
  if (::fsync(fd) != 0) {
    int e = errno;
    ::close(fd);
    throw Error(fmt::format("cannot fsync {}: {}", path, std::strerror(e)));
  }
  if (::close(fd) != 0) throw Error(fmt::format("cannot close {}: {}", path, std::strerror(errno)));
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw Error(fmt::format("cannot open directory {}: {}", dir, std::strerror(errno)));
  int r = ::fsync(fd);
  int e = errno;
  ::close(fd);
  if (r != 0) throw Error(fmt::format("cannot fsync directory {}: {}", dir, std::strerror(e)));
}

int64_t step_of(const std::string& name) {
  if (name.rfind("step_", 0) != 0 || name.size() <= 5) return -1;
  int64_t s = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(name[i]))) return -1;
    s = s * 10 + (name[i] - '0');
  }
  return s;
}

}  // namespace

std::string checkpoint_name(int64_t step) { return fmt::format("step_{:08d}", step); }

std::vector<std::string> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return {};
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    int64_t s = step_of(e.path().filename().string());
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

std::string save_checkpoint(const std::string& dir, ParamStore& params, StepRunner& runner,
                            const nlohmann::json& state, const std::string& config_text,
                            int keep) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(fmt::format("cannot create checkpoint directory {}: {}", dir, ec.message()));
  const int64_t step = runner.step_count();
  const std::string name = checkpoint_name(step);
  const std::string final_path = (fs::path(dir) / name).string();
  const std::string tmp = (fs::path(dir) / fmt::format(".tmp.{}.{}", name, ::getpid())).string();
  fs::remove_all(tmp, ec);
  if (!fs::create_directory(tmp, ec) || ec)
    throw Error(fmt::format("cannot create {}: {}", tmp, ec.message()));
  try {
    params.save(tmp + "/model.safetensors");
    std::vector<TensorToWrite> opt;
    for (const auto& p : params.infos()) {
      opt.push_back({"adam.m." + p.name, DType::f32, p.shape, runner.moment(p.name, 0)});
      opt.push_back({"adam.v." + p.name, DType::f32, p.shape, runner.moment(p.name, 1)});
    }
    write_safetensors(tmp + "/optimizer.safetensors", opt);
    nlohmann::json st = state;
    st["format"] = 1;
    st["step"] = step;
    write_file_synced(tmp + "/state.json", st.dump(2) + "\n");
    write_file_synced(tmp + "/config.toml", config_text);
    fsync_dir(tmp);
    if (fs::exists(final_path)) fs::remove_all(final_path);  // re-saving the same step
    fs::rename(tmp, final_path);
    fsync_dir(dir);
  } catch (const fs::filesystem_error& e) {
    fs::remove_all(tmp, ec);
    throw Error(fmt::format("cannot write checkpoint {}: {}", final_path, e.what()));
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
  // Sweep: older checkpoints beyond `keep`, and temp directories of crashed writers.
  auto all = list_checkpoints(dir);
  for (size_t i = 0; keep > 0 && i + size_t(keep) < all.size(); ++i) fs::remove_all(all[i], ec);
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().filename().string().rfind(".tmp.", 0) == 0) fs::remove_all(e.path(), ec);
  return final_path;
}

nlohmann::json load_checkpoint(const std::string& path, ParamStore& params, StepRunner& runner) {
  const std::string state_path = path + "/state.json";
  std::ifstream in(state_path);
  if (!in) throw Error(fmt::format("checkpoint {}: cannot read state.json", path));
  nlohmann::json st;
  try {
    st = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("checkpoint {}: state.json is corrupt ({})", state_path, e.what()));
  }
  if (!st.is_object() || !st.contains("step") || !st["step"].is_number_integer() ||
      st.value("format", 0) != 1)
    throw Error(fmt::format("checkpoint {}: state.json lacks an integer 'step' or format 1",
                            state_path));
  params.load(path + "/model.safetensors");
  const std::string opt_path = path + "/optimizer.safetensors";
  SafetensorsFile opt = SafetensorsFile::open(opt_path);
  for (const auto& p : params.infos())
    for (int which = 0; which < 2; ++which) {
      std::string name = (which == 0 ? "adam.m." : "adam.v.") + p.name;
      if (!opt.contains(name))
        throw Error(fmt::format("checkpoint {}: missing tensor '{}'", opt_path, name));
      const TensorView& t = opt.get(name);
      if (t.dtype != DType::f32 || t.shape != p.shape)
        throw Error(fmt::format("checkpoint {}: tensor '{}' is {}{}, expected f32{}", opt_path, name,
                                dtype_name(t.dtype), shape_str(t.shape), shape_str(p.shape)));
      std::memcpy(runner.moment(p.name, which), t.data, t.nbytes);
    }
  runner.set_step_count(st["step"].get<int64_t>());
  return st;
}

}  // namespace loom::train
