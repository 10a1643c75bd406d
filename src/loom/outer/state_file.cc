#include "loom/outer/state_file.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "loom/core/error.h"
#include "loom/core/file.h"
#include "loom/core/safetensors.h"
#include "loom/dipaco/paths.h"

namespace loom::outer {

namespace {

// The "loom_outer" metadata of an open state file, as text.
const std::string& metadata_text(const SafetensorsFile& f, const std::string& path) {
  auto it = f.metadata().find("loom_outer");
  if (it == f.metadata().end())
    throw Error(fmt::format("{}: not an outer server state (no loom_outer metadata)", path));
  return it->second;
}

// Runs `read` on the parsed metadata: bad JSON, a missing key or a wrong type is a loom::Error
// naming the file (an Error that `read` throws passes as it is).
template <class F>
auto read_metadata(const std::string& text, const std::string& path, F read) {
  try {
    return read(nlohmann::json::parse(text));
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{}: malformed loom_outer metadata: {}", path, e.what()));
  }
}

}  // namespace

std::string state_file(const std::string& state_dir) {
  return state_dir + "/outer_state.safetensors";
}

void write_state(const std::string& path, const StateMeta& meta, const TensorList& params,
                 const TensorList& momentum, const TensorList& buffer) {
  std::vector<TensorToWrite> ts;
  auto add = [&](const std::string& prefix, const TensorList& l) {
    for (const auto& t : l) ts.push_back({prefix + t.name, DType::f32, t.shape, t.data.data()});
  };
  add("param.", params);
  add("momentum.", momentum);
  if (meta.mode == OuterMode::async) add("buffer.", buffer);
  nlohmann::json ms = nlohmann::json::array();
  for (const auto& [id, m] : meta.members) {
    ms.push_back({{"id", id},
                  {"name", m.name},
                  {"joined_round",
                   m.joined.size() == 1 ? nlohmann::json(m.joined[0]) : nlohmann::json(m.joined)},
                  {"sec_per_step", m.sec_per_step}});
    if (m.path) ms.back()["path"] = m.path;  // DiPaCo
  }
  nlohmann::json j{{"format", 1},
                   {"mode", outer_mode_name(meta.mode)},
                   {"version", meta.version},
                   {"async_count", meta.async_count},
                   {"total_steps", meta.total_steps},
                   {"next_id", meta.next_id},
                   {"members", ms},
                   {"keys", meta.keys}};
  if (meta.fragment_versions.size() > 1) j["fragment_versions"] = meta.fragment_versions;
  if (meta.mode == OuterMode::async) j["periods"] = meta.periods;
  write_safetensors(path, ts, {{"loom_outer", j.dump()}});
}

OuterState read_state(const std::string& path, OuterMode mode, const TensorList& spec,
                      int64_t fragments) {
  auto f = SafetensorsFile::open(path);
  OuterState out;
  out.meta = read_metadata(metadata_text(f, path), path, [&](const nlohmann::json& j) {
    StateMeta s;
    s.mode = mode;
    if (j.at("format").get<int>() != 1)
      throw Error(fmt::format("{}: unknown state format {}", path, j.at("format").dump()));
    const std::string want = outer_mode_name(mode);
    if (j.at("mode").get<std::string>() != want)
      throw Error(fmt::format("{}: the state is of a {} server, this one is {}", path,
                              j.at("mode").get<std::string>(), want),
                  "use another --state-dir, or the same [outer] mode");
    s.version = j.at("version").get<uint64_t>();
    // written only with more than one fragment
    s.fragment_versions = j.contains("fragment_versions")
                              ? j.at("fragment_versions").get<std::vector<uint64_t>>()
                              : std::vector<uint64_t>{s.version};
    if (int64_t(s.fragment_versions.size()) != fragments)
      throw Error(fmt::format("{}: the state is of a server with {} fragment(s), this one has {}",
                              path, s.fragment_versions.size(), fragments),
                  "use another --state-dir, or the same [outer] fragments");
    s.async_count = j.at("async_count").get<int64_t>();
    s.periods = j.value("periods", uint64_t(0));  // written since periods close on the beat
    s.total_steps = j.at("total_steps").get<int64_t>();
    s.next_id = j.at("next_id").get<uint64_t>();
    for (const auto& m : j.at("members")) {
      const auto& joined = m.at("joined_round");
      const uint64_t on = m.value("path", uint64_t(0));
      if (on >= uint64_t(dipaco::kMaxPaths))
        throw Error(fmt::format("{}: member {}'s path {} is not one a server could have", path,
                                m.at("id").dump(), on),
                    "the file is damaged: restore it, or use another --state-dir");
      const uint64_t id = m.at("id").get<uint64_t>();
      if (s.members.count(id))
        throw Error(fmt::format("{}: member {} is listed twice", path, id),
                    "the file is damaged: restore it, or use another --state-dir");
      s.members[id] = {m.at("name").get<std::string>(),
                       joined.is_array() ? joined.get<std::vector<uint64_t>>()
                                         : std::vector<uint64_t>{joined.get<uint64_t>()},
                       m.at("sec_per_step").get<double>(), uint32_t(on)};
    }
    if (j.contains("keys"))  // written since islands have keys
      s.keys = j.at("keys").get<std::map<std::string, uint64_t>>();
    // counts a server can reach (2^53: exact in a double, a round a nanosecond for 100 days)
    constexpr uint64_t kMax = uint64_t(1) << 53;
    auto field = [&](const char* key, bool ok) {
      if (!ok)
        throw Error(fmt::format("{}: loom_outer's \"{}\" = {} is not a state this server could "
                                "have written",
                                path, key, j.at(key).dump()),
                    "the file is damaged: restore it, or use another --state-dir");
    };
    field("version", s.version <= kMax);
    uint64_t sum = 0;  // when there is no "fragment_versions", it is {version}
    for (uint64_t v : s.fragment_versions) {
      sum += v;
      field("fragment_versions", v <= kMax && sum <= kMax);
    }
    field("version", s.version == sum);
    // a sync server never counts async pushes
    field("async_count", s.async_count >= 0 && uint64_t(s.async_count) <= kMax &&
                             (mode == OuterMode::async || s.async_count == 0));
    // each period holds at least one push (one version); a sync server counts none
    if (j.contains("periods"))
      field("periods", s.periods <= s.version && (mode == OuterMode::async || s.periods == 0));
    field("total_steps", s.total_steps >= 0 && uint64_t(s.total_steps) <= kMax);
    uint64_t top = 0;
    for (const auto& [id, m] : s.members) {
      top = std::max(top, id);
      bool joined_ok = m.joined.size() == s.fragment_versions.size();
      for (size_t f = 0; joined_ok && f < m.joined.size(); ++f)
        joined_ok = m.joined[f] <= s.fragment_versions[f] + 1;
      field("members", id >= 1 && joined_ok && std::isfinite(m.sec_per_step) &&
                           m.sec_per_step >= 0 && m.name.size() <= kMaxNameBytes);
    }
    field("next_id", s.next_id >= 1 && s.next_id <= kMax && s.next_id > top);
    for (const auto& [key, id] : s.keys)
      field("keys", id >= 1 && id < s.next_id && key.size() <= kMaxKeyBytes);
    field("keys", s.keys.size() <= kMaxKeys);
    return s;
  });
  std::set<std::string> expected;
  auto load = [&](const std::string& prefix, TensorList& into) {
    for (auto& t : into) {
      expected.insert(prefix + t.name);
      const TensorView& v = f.get(prefix + t.name);
      if (v.dtype != DType::f32 || v.shape != t.shape)
        throw Error(
            fmt::format("{}: tensor '{}{}' is {}{}, the model's is f32{}", path, prefix, t.name,
                        dtype_name(v.dtype), shape_str(v.shape), shape_str(t.shape)),
            "this state belongs to another model: use another --state-dir");
      std::memcpy(t.data.data(), v.data, v.nbytes);
      if (const int64_t i = first_nonfinite(t.data.data(), int64_t(t.data.size())); i >= 0)
        throw Error(fmt::format("{}: tensor '{}{}' holds {} at index {}", path, prefix, t.name,
                                t.data[size_t(i)], i),
                    "the state is damaged: restore it, or use another --state-dir");
    }
  };
  out.params = zeros_like(spec);
  out.momentum = zeros_like(spec);
  out.buffer = zeros_like(spec);
  load("param.", out.params);
  load("momentum.", out.momentum);
  if (mode == OuterMode::async) load("buffer.", out.buffer);
  for (const auto& n : f.names())  // a larger model's state holds this one's tensors and more
    if (!expected.count(n))
      throw Error(fmt::format("{}: tensor '{}' is not part of this model's state", path, n),
                  "this state belongs to another model: use another --state-dir");
  return out;
}

TensorList read_state_params(const std::string& path, uint64_t* version) {
  auto f = SafetensorsFile::open(path);
  const std::string& text = metadata_text(f, path);
  if (version)
    *version = read_metadata(
        text, path, [](const nlohmann::json& j) { return j.at("version").get<uint64_t>(); });
  TensorList out;
  for (const auto& n : f.names()) {
    if (n.rfind("param.", 0) != 0) continue;
    const TensorView& v = f.get(n);
    if (v.dtype != DType::f32) throw Error(fmt::format("{}: tensor '{}' is not f32", path, n));
    Tensor t{n.substr(6), v.shape, std::vector<float>(v.nbytes / 4)};
    std::memcpy(t.data.data(), v.data, v.nbytes);
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace loom::outer
