// The outer server's state file: a write read back is the same state (sync and async), and a file
// that is not a state, is corrupt, or belongs to another model, mode or format is a loom::Error
// naming the file and what is wrong.
#include "loom/outer/state_file.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <limits>

#include "loom/core/error.h"
#include "loom/core/safetensors.h"
#include "loom/outer/testing.h"

namespace loom::outer {
namespace {

namespace fs = std::filesystem;

using test::model;
using test::TempDir;

void expect_equal(const TensorList& a, const TensorList& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t t = 0; t < a.size(); ++t) {
    EXPECT_EQ(a[t].name, b[t].name);
    EXPECT_EQ(a[t].shape, b[t].shape);
    EXPECT_EQ(a[t].data, b[t].data) << a[t].name;
  }
}

// The message of the loom::Error that `f` throws; "" (and a failure) if it throws none.
template <class F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no loom::Error";
  return "";
}

StateMeta sample_meta(OuterMode mode) {
  StateMeta m;
  m.mode = mode;
  m.version = 12;
  m.async_count = mode == OuterMode::async ? 7 : 0;
  m.periods = mode == OuterMode::async ? 3 : 0;
  m.total_steps = 600;
  m.next_id = 4;
  m.members[1] = {"host-a", {0}, 0.25};
  m.members[3] = {"host-c", {5}, 0};
  m.keys["host-a:/runs/a"] = 1;
  return m;
}

TEST(StateFile, AStateWrittenIsReadBackWhole) {
  TempDir dir;
  const std::string path = state_file(dir.path);
  EXPECT_EQ(path, dir.path + "/outer_state.safetensors");
  for (OuterMode mode : {OuterMode::sync, OuterMode::async}) {
    const StateMeta meta = sample_meta(mode);
    const TensorList p = model(1), m = model(2), b = model(3);
    write_state(path, meta, p, m, b);
    const TensorList spec = zeros_like(p);
    OuterState s = read_state(path, mode, spec);
    EXPECT_EQ(s.meta.mode, mode);
    EXPECT_EQ(s.meta.version, 12u);
    EXPECT_EQ(s.meta.async_count, meta.async_count);
    EXPECT_EQ(s.meta.periods, meta.periods);
    EXPECT_EQ(s.meta.total_steps, 600);
    EXPECT_EQ(s.meta.next_id, 4u);
    ASSERT_EQ(s.meta.members.size(), 2u);
    EXPECT_EQ(s.meta.members.at(1).name, "host-a");
    EXPECT_EQ(s.meta.members.at(1).sec_per_step, 0.25);
    EXPECT_EQ(s.meta.members.at(3).joined, std::vector<uint64_t>{5});
    EXPECT_EQ(s.meta.keys, (std::map<std::string, uint64_t>{{"host-a:/runs/a", 1}}));
    expect_equal(s.params, p);
    expect_equal(s.momentum, m);
    // the buffer is kept in async mode only
    expect_equal(s.buffer, mode == OuterMode::async ? b : zeros_like(b));
    uint64_t v = 0;
    expect_equal(read_state_params(path, &v), p);
    EXPECT_EQ(v, 12u);
  }
}

// Streaming fragments: each fragment's version, and each member's first round per fragment, come
// back; a server with another number of fragments refuses the state.
TEST(StateFile, FragmentVersionsAreKeptAndMustMatchTheServers) {
  TempDir dir;
  const std::string path = state_file(dir.path);
  StateMeta meta = sample_meta(OuterMode::sync);
  meta.version = 12;
  meta.fragment_versions = {5, 4, 3};
  meta.members[1].joined = {0, 0, 0};
  meta.members[3].joined = {5, 4, 4};
  const TensorList p = model(1);
  write_state(path, meta, p, p, p);
  OuterState s = read_state(path, OuterMode::sync, zeros_like(p), 3);
  EXPECT_EQ(s.meta.version, 12u);
  EXPECT_EQ(s.meta.fragment_versions, std::vector<uint64_t>({5, 4, 3}));
  EXPECT_EQ(s.meta.members.at(3).joined, std::vector<uint64_t>({5, 4, 4}));
  EXPECT_EQ(error_of([&] { read_state(path, OuterMode::sync, zeros_like(p), 2); }),
            path +
                ": the state is of a server with 3 fragment(s), this one has 2\n"
                "hint: use another --state-dir, or the same [outer] fragments");
  write_state(path, sample_meta(OuterMode::sync), p, p, p);  // one fragment
  EXPECT_EQ(error_of([&] { read_state(path, OuterMode::sync, zeros_like(p), 3); }),
            path +
                ": the state is of a server with 1 fragment(s), this one has 3\n"
                "hint: use another --state-dir, or the same [outer] fragments");
  // versions that do not add up, a member's first round past its fragment's next
  meta.fragment_versions = {5, 4, 4};
  write_state(path, meta, p, p, p);
  std::string e = error_of([&] { read_state(path, OuterMode::sync, zeros_like(p), 3); });
  EXPECT_NE(e.find("\"version\" = 12 is not a state"), std::string::npos) << e;
  meta.fragment_versions = {5, 4, 3};
  meta.members[3].joined = {5, 4, 5};
  write_state(path, meta, p, p, p);
  e = error_of([&] { read_state(path, OuterMode::sync, zeros_like(p), 3); });
  EXPECT_NE(e.find("\"members\""), std::string::npos) << e;
}

TEST(StateFile, AStateOfAnotherModelModeOrFormatIsRefusedNamingTheFile) {
  TempDir dir;
  const std::string path = state_file(dir.path);
  const TensorList p = model(1);
  write_state(path, sample_meta(OuterMode::sync), p, p, p);

  TensorList other = zeros_like(p);
  other[0].shape = {4, 3};
  EXPECT_EQ(error_of([&] { read_state(path, OuterMode::sync, other); }),
            path +
                ": tensor 'param.w' is f32[3,4], the model's is f32[4,3]\n"
                "hint: this state belongs to another model: use another --state-dir");
  EXPECT_EQ(error_of([&] { read_state(path, OuterMode::async, zeros_like(p)); }),
            path +
                ": the state is of a sync server, this one is async\n"
                "hint: use another --state-dir, or the same [outer] mode");

  // another format, metadata that is not JSON, no metadata
  std::vector<TensorToWrite> ts{{"param.b", DType::f32, {5}, p[1].data.data()}};
  write_safetensors(path, ts, {{"loom_outer", R"({"format": 2, "mode": "sync"})"}});
  EXPECT_EQ(error_of([&] { read_state(path, OuterMode::sync, zeros_like(p)); }),
            path + ": unknown state format 2");
  write_safetensors(path, ts, {{"loom_outer", "{not json"}});
  std::string e = error_of([&] { read_state(path, OuterMode::sync, zeros_like(p)); });
  EXPECT_EQ(e.rfind(path + ": malformed loom_outer metadata: ", 0), 0u) << e;
  EXPECT_EQ(read_state_params(path, nullptr).size(), 1u);  // no version asked: no JSON read
  write_safetensors(path, ts);
  EXPECT_EQ(error_of([&] { read_state_params(path); }),
            path + ": not an outer server state (no loom_outer metadata)");
}

// A state a server could not have written is refused naming the field or tensor: a larger model's
// (this one's tensors and more), impossible counts (a version of 2^64 - 1 hung the server), a
// member's id at or past next_id, non-finite parameters.
TEST(StateFile, AStateThisServerCouldNotHaveWrittenIsRefused) {
  TempDir dir;
  const std::string path = state_file(dir.path);
  const TensorList p = model(1);
  TensorList larger = p;
  larger.push_back({"extra", {2}, {1, 2}});
  write_state(path, sample_meta(OuterMode::sync), larger, larger, larger);
  std::string e = error_of([&] { read_state(path, OuterMode::sync, p); });
  EXPECT_NE(e.find("tensor 'param.extra' is not part of this model's state"), std::string::npos)
      << e;

  auto with = [&](auto edit) {
    StateMeta m = sample_meta(OuterMode::sync);
    edit(m);
    write_state(path, m, p, p, p);
    return error_of([&] { read_state(path, OuterMode::sync, p); });
  };
  e = with([](StateMeta& m) { m.version = ~uint64_t(0); });
  EXPECT_NE(e.find("\"version\" = 18446744073709551615"), std::string::npos) << e;
  e = with([](StateMeta& m) { m.total_steps = -5; });
  EXPECT_NE(e.find("\"total_steps\""), std::string::npos) << e;
  e = with([](StateMeta& m) { m.next_id = 3; });  // member 3 exists
  EXPECT_NE(e.find("\"next_id\""), std::string::npos) << e;
  e = with([](StateMeta& m) { m.members[1].sec_per_step = -1; });
  EXPECT_NE(e.find("\"members\""), std::string::npos) << e;
  e = with([](StateMeta& m) { m.keys["host:/runs/z"] = 4; });  // an id never given
  EXPECT_NE(e.find("\"keys\""), std::string::npos) << e;
  e = with([](StateMeta& m) { m.members[1].name = std::string(kMaxNameBytes + 1, 'x'); });
  EXPECT_NE(e.find("\"members\""), std::string::npos) << e;
  e = with([](StateMeta& m) { m.async_count = 2; });  // an async server's field, in a sync state
  EXPECT_NE(e.find("\"async_count\""), std::string::npos) << e;
  {  // more Delayed Nesterov periods closed than pushes made
    StateMeta m = sample_meta(OuterMode::async);
    m.periods = 13;
    write_state(path, m, p, p, p);
    e = error_of([&] { read_state(path, OuterMode::async, p); });
    EXPECT_NE(e.find("\"periods\" = 13"), std::string::npos) << e;
  }
  {  // a member listed twice (write_state's map cannot hold it: the JSON is edited)
    StateMeta m = sample_meta(OuterMode::sync);
    m.members[2] = {"host-a", {0}, 0.25};
    write_state(path, m, p, p, p);
    auto f = SafetensorsFile::open(path);
    std::string meta = f.metadata().at("loom_outer");
    const size_t at = meta.find("\"id\":2");
    ASSERT_NE(at, std::string::npos) << meta;
    meta.replace(at, 6, "\"id\":1");
    std::vector<TensorToWrite> ts;
    for (const auto& n : f.names()) {
      const TensorView& v = f.get(n);
      ts.push_back({n, v.dtype, v.shape, v.data});
    }
    write_safetensors(path + ".edited", ts, {{"loom_outer", meta}});
    e = error_of([&] { read_state(path + ".edited", OuterMode::sync, p); });
    EXPECT_NE(e.find("member 1 is listed twice"), std::string::npos) << e;
  }

  TensorList bad = p;
  bad[1].data[2] = std::numeric_limits<float>::infinity();
  write_state(path, sample_meta(OuterMode::sync), bad, p, p);
  e = error_of([&] { read_state(path, OuterMode::sync, p); });
  EXPECT_NE(e.find("tensor 'param.b' holds inf at index 2"), std::string::npos) << e;
}

TEST(StateFile, ACorruptFileIsAnErrorNamingIt) {
  TempDir dir;
  const std::string path = state_file(dir.path);
  write_state(path, sample_meta(OuterMode::sync), model(1), model(1), model(1));
  const auto size = fs::file_size(path);
  fs::resize_file(path, size - 7);  // truncated
  std::string e = error_of([&] { read_state(path, OuterMode::sync, zeros_like(model(1))); });
  EXPECT_NE(e.find(path), std::string::npos) << e;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << "not a state at all";
  e = error_of([&] { read_state_params(path); });
  EXPECT_NE(e.find(path), std::string::npos) << e;
}

}  // namespace
}  // namespace loom::outer
