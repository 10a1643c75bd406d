#include "loom/infer/sample.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <vector>

#include "loom/backend/backend.h"
#include "loom/core/error.h"
#include "loom/core/file.h"
#include "loom/dipaco/choose.h"
#include "loom/infer/decode.h"
#include "loom/infer/sampler.h"
#include "loom/train/checkpoint.h"
#include "loom/train/hf_dir.h"
#include "loom/train/params.h"

namespace loom::infer {

namespace fs = std::filesystem;

namespace {

constexpr int kBytes = 256;  // byte-level tokens: ids 0..255

// The run's tokenizer: RUN_DIR's tokenizer.model or tokenizer.json, else the one in its [data]
// path (a loom data prepare directory), else its [model] init directory's tokenizer.json (a
// pretrained model's), else bytes.
data::Tokenizer run_tokenizer(const std::string& run, const train::Config& cfg) {
  std::error_code ec;
  for (const std::string& dir : {run, cfg.data.path, cfg.init_weights})
    for (const char* name : {"/tokenizer.model", "/tokenizer.json"})
      if (!dir.empty() && fs::is_regular_file(dir + name, ec))
        return data::Tokenizer::load(dir + name);
  return data::Tokenizer::byte_level();
}

// The prompt's tokens (a newline for an empty prompt).
std::vector<int32_t> encode_prompt(const data::Tokenizer& tok, const std::string& prompt) {
  std::vector<int32_t> ids = tok.encode(prompt);
  return ids.empty() ? tok.encode("\n") : ids;
}

// Generated ids to text as it becomes final: BPE output is the decoding of every id so far, and
// a trailing U+FFFD (a byte run not yet a UTF-8 character) is held back until generation ends.
class TextStream {
 public:
  TextStream(const data::Tokenizer& tok, const std::string& prompt)
      : tok_(tok), ids_(tok.encode(prompt)), printed_(prompt.size()) {}
  std::string push(int32_t id) {
    ids_.push_back(id);
    return take(false);
  }
  std::string finish() { return take(true); }

 private:
  std::string take(bool final) {
    const std::string text = tok_.decode(ids_);
    size_t stable = text.size();
    const std::string_view kReplacement = "\xEF\xBF\xBD";
    while (!final && stable >= printed_ + 3 && text.compare(stable - 3, 3, kReplacement) == 0)
      stable -= 3;
    std::string r = stable > printed_ ? text.substr(printed_, stable - printed_) : "";
    printed_ = std::max(printed_, stable);
    return r;
  }
  const data::Tokenizer& tok_;
  std::vector<int32_t> ids_;
  size_t printed_;
};

}  // namespace

Model open_model(const ModelSource& s) {
  Model m;
  std::string run = s.run, checkpoint = s.checkpoint;
  if (std::error_code ec; fs::is_regular_file(run, ec)) {
    const bool gguf = fs::path(run).extension() == ".gguf";
    throw Error(fmt::format("{} is a {}file, not a run directory or a Hugging Face model directory",
                            run, gguf ? "GGUF " : ""),
                gguf ? "convert it to a Hugging Face directory first (transformers loads GGUF "
                       "with gguf_file=; bench/smollm2.py shows how)"
                     : "give the directory loom train wrote, or one with config.json, the "
                       "weights and tokenizer.json");
  }
  if (!s.path.empty()) {  // DiPaCo: one path's model
    const dipaco::PathChoice c =
        dipaco::choose_path(run, s.path, [&](const std::string& dir, const train::Config& cfg) {
          return encode_prompt(run_tokenizer(dir, cfg), s.prompt);
        });
    m.dipaco_path = c.path;
    m.routed = c.routed;
    run = c.run;
    if (checkpoint.empty()) checkpoint = run;
  }
  // a run directory (config.toml, checkpoints), or a Hugging Face model directory (config.json,
  // weights, tokenizer.json: a pretrained model as it is)
  const bool hf = train::is_hf_dir(run) && !path_exists(run + "/config.toml");
  if (hf) {
    m.cfg.model = train::read_hf_model(run);
    m.cfg.path = run + "/config.json";
    m.cfg.init_weights = run;
  } else {
    m.cfg = train::load_run_config(run);
  }
  m.config = hf ? m.cfg.path : run + "/config.toml";
  m.tok = run_tokenizer(run, m.cfg);
  const data::Tokenizer& tok = m.tok;
  const int64_t vocab = m.cfg.model.vocab_size;
  if (hf && tok.is_byte_level() && vocab != kBytes)
    throw Error(fmt::format("{}: no tokenizer.json beside the model (vocab_size {})", run, vocab),
                "copy the model's tokenizer.json into the directory");
  if (!tok.is_byte_level() && tok.vocab_size() > vocab)
    throw Error(fmt::format("the tokenizer's vocabulary does not match the model: {} pieces in "
                            "the tokenizer of {}, [model] vocab_size = {} in {}",
                            tok.vocab_size(), run, vocab, m.config),
                "the run's tokenizer.model must be the one its data was prepared with");
  if (tok.is_byte_level() && vocab < kBytes)
    throw Error(fmt::format("{}: [model] vocab_size = {} is too small for byte-level tokens",
                            m.config, vocab),
                "loom sample reads byte-level models (vocab_size >= 256), as loom train makes");
  m.weights = hf && checkpoint.empty() ? run : train::run_weights(run, checkpoint);
  // a Hugging Face directory's own files; a run's copy of its source's; else the source's
  const std::string chat_dir = hf                                     ? run
                               : path_exists(run + "/hf")             ? run + "/hf"
                               : train::is_hf_dir(m.cfg.init_weights) ? m.cfg.init_weights
                                                                      : "";
  m.chat = read_chat_files(chat_dir, tok, vocab);
  return m;
}

SampleStats sample(const Model& m, const SampleOptions& o,
                   const std::function<void(std::string_view)>& out) {
  using Clock = std::chrono::steady_clock;
  auto seconds = [](Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  };
  const auto t_start = Clock::now();
  const data::Tokenizer& tok = m.tok;
  if (o.context > m.cfg.model.max_seq_len)
    throw Error(fmt::format("--context {}: more than the model's max_seq_len {}", o.context,
                            m.cfg.model.max_seq_len),
                "RoPE and learned positions hold no position past it: leave --context out");
  const int64_t T = o.context ? o.context : std::min<int64_t>(m.cfg.model.max_seq_len, 512);
  train::ParamStore params(m.cfg.model);
  params.load(m.weights);
  runtime::DeviceKind device = m.cfg.train.device;
  if (o.device == "cpu" || o.device == "cuda")
    device = o.device == "cpu" ? runtime::DeviceKind::cpu : runtime::DeviceKind::cuda;
  else if (!o.device.empty())
    throw Error(fmt::format("--device {}: one of cpu, cuda", o.device));
  models::ModelConfig model = m.cfg.model;
  if (!o.dtype.empty()) {
    DType t = DType::f32;
    if (!parse_dtype(o.dtype, &t) || t == DType::i32)
      throw Error(fmt::format("--dtype {}: one of f32, bf16", o.dtype));
    model.dtype = t;
  }
  DecodeRunner decoder(model, params, T, m.config, backend::open(device));
  const auto t_loaded = Clock::now();

  // context: the tokens the cache holds (the prompt's last T at first), the newest last
  std::vector<int32_t> context = encode_prompt(tok, o.prompt);
  if (int64_t(context.size()) > T) context.erase(context.begin(), context.end() - T);
  if (o.echo_prompt) out(o.prompt);
  const int n = tok.is_byte_level() ? kBytes : tok.vocab_size();  // candidate ids 0..n-1
  TextStream text(tok, o.prompt);
  std::string written;  // the generated text so far, for the stop strings
  size_t longest_stop = 0;
  for (const std::string& s : o.stop) longest_stop = std::max(longest_stop, s.size());
  auto write = [&](std::string_view piece) {
    out(piece);
    if (o.stop.empty()) return false;
    const size_t from = written.size() > longest_stop ? written.size() - longest_stop : 0;
    written.append(piece);
    for (const std::string& s : o.stop)
      if (!s.empty() && written.find(s, from) != std::string::npos) return true;
    return false;
  };
  Sampler sampler(o.temperature, o.top_k, o.seed);
  SampleStats st;
  st.prompt_tokens = int64_t(context.size());
  st.context = T;
  const float* row = o.max_tokens > 0 ? decoder.feed(context.data(), st.prompt_tokens) : nullptr;
  const auto t_prompt = Clock::now();
  for (int64_t i = 0; i < o.max_tokens; ++i) {
    for (int v = 0; v < n; ++v)
      if (!std::isfinite(row[v]))
        throw Error(fmt::format("weights {}: the logits are not finite ({} for token {})",
                                m.weights, row[v], v),
                    "the checkpoint is corrupt or the run diverged; try an earlier checkpoint");
    const int next = sampler.next(row, n);
    st.new_tokens = i + 1;
    if (std::find(o.stop_ids.begin(), o.stop_ids.end(), next) != o.stop_ids.end()) {
      st.stopped = "stop_id";
      break;
    }
    context.push_back(next);
    bool stop = false;
    if (tok.is_byte_level()) {
      const char byte = static_cast<char>(static_cast<unsigned char>(next));
      stop = write(std::string_view(&byte, 1));
    } else if (const std::string piece = text.push(next); !piece.empty()) {
      stop = write(piece);
    }
    if (stop) {
      st.stopped = "stop_string";
      break;
    }
    if (i + 1 == o.max_tokens) break;
    if (decoder.position() < decoder.capacity()) {
      row = decoder.feed(&context.back(), 1);
    } else {  // the cache is full: keep its newest half (and the new token), encoded again
      const int64_t keep = std::max<int64_t>(1, T / 2);
      context.erase(context.begin(), context.end() - keep);
      decoder.reset();
      row = decoder.feed(context.data(), keep);
    }
  }
  if (!tok.is_byte_level())
    if (const std::string rest = text.finish(); !rest.empty()) out(rest);
  const auto t_end = Clock::now();
  st.load_s = seconds(t_start, t_loaded);
  st.prompt_s = seconds(t_loaded, t_prompt);
  st.decode_s = seconds(t_prompt, t_end);
  return st;
}

}  // namespace loom::infer
