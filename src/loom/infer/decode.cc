#include "loom/infer/decode.h"

#include <fmt/format.h>

#include <bit>
#include <cstring>

#include "loom/core/error.h"
#include "loom/runtime/memory_plan.h"

namespace loom::infer {

DecodeRunner::DecodeRunner(const models::ModelConfig& model, train::ParamStore& params,
                           int64_t cache_len, std::string source)
    : model_(model), params_(params), cache_len_(cache_len), source_(std::move(source)) {
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
  s.exec = std::make_unique<runtime::Executor>(g);
  for (const auto& p : params_.infos()) s.exec->bind(g.find(p.name), params_.data(p.name));
  s.tokens.resize(size_t(n));
  s.exec->bind(s.c.model.tokens, s.tokens.data());
  s.exec->bind(s.c.model.start, &s.start);
  for (int v : s.c.model.caches) {
    const ir::Value& cv = g.value(v);
    auto& buf = caches_[cv.name];
    if (buf.empty()) buf.assign(size_t(runtime::value_bytes(cv)), 0);
    LOOM_CHECK(int64_t(buf.size()) == runtime::value_bytes(cv)) << cv.name;
    s.exec->bind(v, buf.data());
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
    s.exec->run();
    logits = s.exec->ptr<float>(s.c.model.logits);
    pos_ += chunk;
    tokens += chunk;
    n -= chunk;
  }
  return logits;
}

}  // namespace loom::infer
