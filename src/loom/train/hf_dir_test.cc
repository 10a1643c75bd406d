// Hugging Face model directories as [model] init: the config.json decides the model, weights load
// from one file, from shards, and from bf16; bad directories are loom::Errors naming the file and
// the tensor or field.
#include "loom/train/hf_dir.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "loom/core/error.h"
#include "loom/core/file.h"
#include "loom/models/architecture.h"
#include "loom/train/config.h"
#include "loom/train/params.h"

namespace loom::train {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("loom_hf_dir_test_" + std::to_string(::getpid()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() { fs::remove_all(path); }
};

const std::string kTied = std::string(LOOM_SOURCE_DIR) + "/configs/tiny-llama-tied.toml";

// The message of the loom::Error that `f` throws ("" when it throws none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void write_json(const fs::path& p, const nlohmann::json& j) {
  write_file_atomic(p.string(), j.dump(2));
}

// A Hugging Face directory of the tiny tied Llama, as `loom export --hf` writes it: config.json and
// model.safetensors with random weights. Returns the weights it wrote.
ParamStore write_hf_dir(const fs::path& dir, const models::ModelConfig& m) {
  fs::create_directories(dir);
  write_json(dir / "config.json", models::architecture(m.arch).hf_config(m));
  ParamStore p(m);
  p.init_random(7);
  p.save((dir / "model.safetensors").string());
  return p;
}

void expect_same(ParamStore& a, ParamStore& b) {
  for (const auto& i : a.infos())
    for (int64_t k = 0; k < numel(i.shape); ++k)
      ASSERT_EQ(a.data(i.name)[k], b.data(i.name)[k]) << i.name << "[" << k << "]";
}

TEST(HfDir, ConfigJsonDecidesTheModel) {
  TempDir d;
  const Config base = load_config(kTied);
  write_hf_dir(d.path / "hf", base.model);
  // a config that names only the init directory (and a dtype): [model] comes from config.json
  const fs::path toml = d.path / "c.toml";
  write_file_atomic(toml.string(), "[model]\ninit = \"" + (d.path / "hf").string() +
                                       "\"\ndtype = \"bf16\"\n[train]\nbatch_size = 2\nseq_len = "
                                       "16\n[optim]\nlr = 1e-3\n");
  const Config c = load_config(toml.string());
  EXPECT_EQ(c.model.arch, "llama");
  EXPECT_EQ(c.model.d_model, base.model.d_model);
  EXPECT_EQ(c.model.n_layers, base.model.n_layers);
  EXPECT_EQ(c.model.n_heads, base.model.n_heads);
  EXPECT_EQ(c.model.kv_heads(), base.model.kv_heads());
  EXPECT_EQ(c.model.ffn(), base.model.ffn());
  EXPECT_EQ(c.model.rope_theta, 100000.0);
  EXPECT_TRUE(c.model.tie_embeddings);
  EXPECT_EQ(c.model.dtype, DType::bf16);
  // the run's saved config holds the whole model, so a resume needs no config.json
  EXPECT_NE(c.text.find("n_kv_heads = 2"), std::string::npos) << c.text;
  // a key the config also sets must agree; max_seq_len may be lower, and 0 (the default) for
  // ffn_hidden or n_kv_heads takes config.json's
  EXPECT_EQ(load_config(toml.string(), {"model.max_seq_len=32"}).model.max_seq_len, 32);
  EXPECT_EQ(load_config(toml.string(), {"model.ffn_hidden=0"}).model.ffn(), base.model.ffn());
  EXPECT_EQ(load_config(toml.string(), {"model.n_kv_heads=0"}).model.kv_heads(), 2);
  std::string e = error_of([&] { load_config(toml.string(), {"model.n_layers=3"}); });
  EXPECT_NE(e.find("[model] n_layers = 3 disagrees with"), std::string::npos) << e;
  EXPECT_NE(e.find("config.json, which gives 2"), std::string::npos) << e;
}

TEST(HfDir, LoadsOneFileShardsAndBf16) {
  TempDir d;
  const models::ModelConfig m = load_config(kTied).model;
  ParamStore want = write_hf_dir(d.path / "one", m);
  ParamStore got(m);
  got.load((d.path / "one").string());
  expect_same(want, got);

  // sharded: two files and an index, as save_pretrained writes a large model
  const fs::path sh = d.path / "sharded";
  fs::create_directories(sh);
  std::vector<TensorToWrite> a, b;
  nlohmann::json map;
  for (size_t i = 0; i < want.infos().size(); ++i) {
    const auto& info = want.infos()[i];
    const char* file =
        i % 2 ? "model-00002-of-00002.safetensors" : "model-00001-of-00002.safetensors";
    (i % 2 ? b : a).push_back({info.name, DType::f32, info.shape, want.data(info.name)});
    map[info.name] = file;
  }
  write_safetensors((sh / "model-00001-of-00002.safetensors").string(), a);
  write_safetensors((sh / "model-00002-of-00002.safetensors").string(), b);
  write_json(sh / "model.safetensors.index.json",
             {{"metadata", {{"total_size", 0}}}, {"weight_map", map}});
  ParamStore got2(m);
  got2.load(sh.string());
  expect_same(want, got2);

  // bf16 on disk widens exactly
  const fs::path bf = d.path / "bf16.safetensors";
  std::vector<std::vector<bf16>> halves;
  std::vector<TensorToWrite> ts;
  for (const auto& info : want.infos()) {
    auto& h = halves.emplace_back();
    for (int64_t k = 0; k < numel(info.shape); ++k)
      h.push_back(f32_to_bf16(want.data(info.name)[k]));
    ts.push_back({info.name, DType::bf16, info.shape, h.data()});
  }
  write_safetensors(bf.string(), ts);
  ParamStore got3(m);
  got3.load(bf.string());
  for (size_t i = 0; i < want.infos().size(); ++i) {
    const auto& info = want.infos()[i];
    for (int64_t k = 0; k < numel(info.shape); ++k)
      ASSERT_EQ(got3.data(info.name)[k], bf16_to_f32(halves[i][size_t(k)])) << info.name;
  }
}

TEST(HfDir, BadDirectoriesNameTheFileAndTheTensorOrField) {
  TempDir d;
  const models::ModelConfig m = load_config(kTied).model;
  const fs::path dir = d.path / "hf";
  ParamStore want = write_hf_dir(dir, m);
  const auto model_of = [&](const nlohmann::json& j) {
    write_json(dir / "config.json", j);
    return read_hf_model(dir.string());
  };
  nlohmann::json good = models::architecture("llama").hf_config(m);

  // unsupported or unknown config.json fields
  nlohmann::json j = good;
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  std::string e = error_of([&] { model_of(j); });
  EXPECT_NE(e.find("config.json: rope_scaling = "), std::string::npos) << e;
  EXPECT_NE(e.find("no rope scaling"), std::string::npos) << e;
  j = good;
  j["rope_parameters"] = {{"rope_type", "llama3"}, {"rope_theta", 500000.0}};
  e = error_of([&] { model_of(j); });
  EXPECT_NE(e.find("rope_parameters.rope_type = \"llama3\""), std::string::npos) << e;
  // values held to the ranges a TOML [model] is, integers never wrapped, token ids typed
  j = good;
  j["rms_norm_eps"] = 1e300;
  e = error_of([&] { model_of(j); });
  EXPECT_NE(e.find("config.json: gives [model] norm_eps, which must be in (0, 1], got 1e+300"),
            std::string::npos)
      << e;
  j = good;
  j["vocab_size"] = uint64_t(1) << 63;
  e = error_of([&] { model_of(j); });
  EXPECT_NE(e.find("vocab_size = 9223372036854775808: 9223372036854775808 is past 2^63-1"),
            std::string::npos)
      << e;
  j = good;
  j["bos_token_id"] = "x";
  e = error_of([&] { model_of(j); });
  EXPECT_NE(e.find("bos_token_id = \"x\": expected a token id"), std::string::npos) << e;
  j = good;
  j["eos_token_id"] = {1, 2};  // a list is an id's form too
  EXPECT_NO_THROW(model_of(j));
  j = good;
  j["sliding_window"] = 4096;
  e = error_of([&] { model_of(j); });
  EXPECT_NE(e.find("sliding_window = 4096: a field Loom does not know"), std::string::npos) << e;
  j = good;
  j["model_type"] = "mistral";
  e = error_of([&] { model_of(j); });
  EXPECT_NE(e.find("model_type = \"mistral\": an architecture Loom does not build"),
            std::string::npos)
      << e;
  j = good;
  j["attention_bias"] = true;
  e = error_of([&] { model_of(j); });
  EXPECT_NE(e.find("attention_bias = true"), std::string::npos) << e;
  j = good;
  j.erase("hidden_size");
  e = error_of([&] { model_of(j); });
  EXPECT_NE(e.find("hidden_size = (absent): a required field is missing"), std::string::npos) << e;
  // transformers 5's rope_parameters with the default type is read
  j = good;
  j.erase("rope_theta");
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 12345.0}};
  EXPECT_EQ(model_of(j).rope_theta, 12345.0);
  model_of(good);

  // weights: a shape that disagrees with config.json names the tensor and the file
  models::ModelConfig wider = m;
  wider.ffn_hidden = m.ffn_hidden + 16;
  ParamStore other(wider);
  other.init_random(1);
  other.save((dir / "model.safetensors").string());
  ParamStore p(m);
  e = error_of([&] { p.load(dir.string()); });
  EXPECT_NE(e.find("model.safetensors: tensor 'model.layers.0.mlp.gate_proj.weight' is f32"),
            std::string::npos)
      << e;

  // a truncated file
  want.save((dir / "model.safetensors").string());
  const std::string bytes = read_file((dir / "model.safetensors").string());
  write_file_atomic((dir / "model.safetensors").string(), bytes.substr(0, bytes.size() / 2));
  e = error_of([&] { p.load(dir.string()); });
  EXPECT_NE(e.find((dir / "model.safetensors").string()), std::string::npos) << e;

  // shards: a missing one, and a tensor the index lists that its shard lacks
  fs::remove(dir / "model.safetensors");
  std::vector<TensorToWrite> first;
  nlohmann::json map;
  for (const auto& info : want.infos()) map[info.name] = "model-00001-of-00002.safetensors";
  map["model.norm.weight"] = "model-00002-of-00002.safetensors";
  for (const auto& info : want.infos())
    if (info.name != "model.norm.weight")
      first.push_back({info.name, DType::f32, info.shape, want.data(info.name)});
  write_safetensors((dir / "model-00001-of-00002.safetensors").string(), first);
  write_json(dir / "model.safetensors.index.json", {{"weight_map", map}});
  e = error_of([&] { p.load(dir.string()); });
  EXPECT_NE(e.find("shard " + (dir / "model-00002-of-00002.safetensors").string() + " is missing"),
            std::string::npos)
      << e;
  map["model.norm.weight"] = "model-00001-of-00002.safetensors";
  write_json(dir / "model.safetensors.index.json", {{"weight_map", map}});
  e = error_of([&] { p.load(dir.string()); });
  EXPECT_NE(e.find("tensor 'model.norm.weight' is listed in"), std::string::npos) << e;
  // no weights at all
  fs::remove(dir / "model.safetensors.index.json");
  e = error_of([&] { p.load(dir.string()); });
  EXPECT_NE(e.find("holds neither model.safetensors nor model.safetensors.index.json"),
            std::string::npos)
      << e;
}

}  // namespace
}  // namespace loom::train
