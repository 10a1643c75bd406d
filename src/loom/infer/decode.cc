#include "loom/infer/decode.h"

#include <fmt/format.h>

#include <bit>
#include <cstring>

#include "loom/core/error.h"
#include "loom/kernels/cpu/kernels.h"
#include "loom/runtime/memory_plan.h"

namespace loom::infer {

DecodeRunner::DecodeRunner(const models::ModelConfig& model, train::ParamStore& params,
                           int64_t cache_len, std::string source, runtime::Device& device)
    : model_(model),
      params_(params),
      cache_len_(cache_len),
      source_(std::move(source)),
      dev_(device) {
  if (cache_len < 1 || cache_len > model.max_seq_len)
    throw Error(
        fmt::format("{}: a key/value cache of {} positions: must be 1..[model] max_seq_len "
                    "= {}",
                    source_, cache_len, model.max_seq_len));
  step_for(1);  // every run needs it; a bad model fails here, before any token
}

DecodeRunner::~DecodeRunner() = default;

DecodeRunner::Step& DecodeRunner::step_for(int64_t n) {
  auto [it, fresh] = steps_.try_emplace(n);
  Step& s = it->second;
  if (!fresh) return s;
  passes::Options o;
  o.model = model_;
  o.batch = 1;
  o.seq_len = n;
  o.kind = passes::StepKind::decode;
  o.cache_len = cache_len_;
  o.source = source_;
  try {
    s.c = passes::compile(o, passes::Stage::forward);
  } catch (...) {
    steps_.erase(it);
    throw;
  }
  const ir::Graph& g = s.c.model.graph;
  s.exec = std::make_unique<runtime::Executor>(g, dev_);
  const bool host = dev_.host_memory();
  for (const auto& p : params_.infos()) {
    void* w = params_.data(p.name);
    if (!host) {  // copied up once, shared by every step graph
      auto [wi, first] = weights_.try_emplace(p.name);
      if (first) {
        const int64_t bytes = numel(p.shape) * 4;
        wi->second = runtime::Buffer(dev_, bytes);
        dev_.upload(wi->second.data(), w, bytes);
      }
      w = wi->second.data();
    }
    s.exec->bind(g.find(p.name), w);
  }
  for (const auto& [copy, master] : s.c.model.weight_copies) {  // rounded once, kept
    const ir::Value& cv = g.value(copy);
    LOOM_CHECK(cv.type.dtype == DType::bf16) << cv.name;
    auto [wi, first] = weights_.try_emplace(cv.name);
    if (first) {
      const int64_t n = numel(cv.type.shape);
      wi->second = runtime::Buffer(dev_, n * 2);
      std::vector<bf16> host_copy(host ? 0 : size_t(n));
      bf16* to = host ? static_cast<bf16*>(wi->second.data()) : host_copy.data();
      kernels::cpu::cast_f32_bf16(params_.data(master), to, n);
      if (!host) dev_.upload(wi->second.data(), host_copy.data(), n * 2);
    }
    s.exec->bind(copy, wi->second.data());
  }
  s.tokens.resize(size_t(n));
  if (host) {
    s.exec->bind(s.c.model.tokens, s.tokens.data());
    s.exec->bind(s.c.model.start, &s.start);
  } else {
    s.dev_tokens = runtime::Buffer(dev_, n * 4);
    s.dev_start = runtime::Buffer(dev_, 4);
    s.exec->bind(s.c.model.tokens, s.dev_tokens.data());
    s.exec->bind(s.c.model.start, s.dev_start.data());
  }
  for (int v : s.c.model.caches) {
    const ir::Value& cv = g.value(v);
    const int64_t bytes = runtime::value_bytes(cv);
    auto [ci, first] = caches_.try_emplace(cv.name);
    if (first) {
      ci->second = runtime::Buffer(dev_, bytes);
      dev_.zero(ci->second.data(), bytes);
    }
    LOOM_CHECK(ci->second.bytes() == bytes) << cv.name;
    s.exec->bind(v, ci->second.data());
  }
  return s;
}

const float* DecodeRunner::feed(const int32_t* tokens, int64_t n) {
  if (n < 1 || pos_ + n > cache_len_)
    throw Error(
        fmt::format("{}: {} tokens at position {} do not fit the key/value cache of {} "
                    "positions",
                    source_, n, pos_, cache_len_));
  const float* logits = nullptr;
  while (n > 0) {
    const int64_t chunk = int64_t(std::bit_floor(uint64_t(n)));
    Step& s = step_for(chunk);
    std::memcpy(s.tokens.data(), tokens, size_t(chunk) * sizeof(int32_t));
    s.start = int32_t(pos_);
    if (dev_.host_memory()) {
      s.exec->run();
      logits = s.exec->ptr<float>(s.c.model.logits);
    } else {  // the GPU's kernels do not check ids: checked here, as the CPU's embedding does
      for (int64_t i = 0; i < chunk; ++i)
        if (tokens[i] < 0 || tokens[i] >= model_.vocab_size)
          throw Error(fmt::format("{}: token id {} is outside the vocabulary [0, {})", source_,
                                  tokens[i], model_.vocab_size));
      dev_.upload(s.dev_tokens.data(), s.tokens.data(), chunk * 4);
      dev_.upload(s.dev_start.data(), &s.start, 4);
      s.exec->run();
      const int64_t V = model_.vocab_size,
                    rows = numel(s.c.model.graph.value(s.c.model.logits).type.shape) / V;
      s.logits.resize(size_t(rows * V));
      dev_.download(s.logits.data(), s.exec->data(s.c.model.logits), rows * V * 4);
      logits = s.logits.data();
    }
    pos_ += chunk;
    tokens += chunk;
    n -= chunk;
  }
  return logits;
}

}  // namespace loom::infer
