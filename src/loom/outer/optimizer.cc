#include "loom/outer/optimizer.h"

namespace loom::outer {

void nesterov_step(const OuterOptConfig& c, TensorList& params, TensorList& momentum,
                   const TensorList& grad) {
  const float lr = float(c.lr), mu = float(c.momentum);
  for (size_t t = 0; t < params.size(); ++t) {
    float* p = params[t].data.data();
    float* m = momentum[t].data.data();
    const float* g = grad[t].data.data();
    for (size_t i = 0, n = params[t].data.size(); i < n; ++i) {
      m[i] = mu * m[i] + g[i];
      p[i] -= lr * (g[i] + mu * m[i]);
    }
  }
}

void delayed_nesterov_push(const OuterOptConfig& c, int64_t period, TensorList& params,
                           TensorList& momentum, TensorList& buffer, int64_t& count,
                           const TensorList& grad) {
  const float lr = float(c.lr), mu = float(c.momentum), inv = 1.f / float(period);
  const bool move = count + 1 >= period;
  for (size_t t = 0; t < params.size(); ++t) {
    float* p = params[t].data.data();
    float* m = momentum[t].data.data();
    float* b = buffer[t].data.data();
    const float* g = grad[t].data.data();
    for (size_t i = 0, n = params[t].data.size(); i < n; ++i) {
      if (move) {
        m[i] = mu * m[i] + (b[i] + g[i]) * inv;
        p[i] -= lr * (g[i] * inv + mu * m[i]);
        b[i] = 0;
      } else {
        b[i] += g[i];
        p[i] -= lr * g[i] * inv;
      }
    }
  }
  count = move ? 0 : count + 1;
}

void delayed_nesterov_close(const OuterOptConfig& c, int64_t period, TensorList& params,
                            TensorList& momentum, TensorList& buffer, int64_t& count) {
  const float lr = float(c.lr), mu = float(c.momentum), inv = 1.f / float(period);
  for (size_t t = 0; t < params.size(); ++t) {
    float* p = params[t].data.data();
    float* m = momentum[t].data.data();
    float* b = buffer[t].data.data();
    for (size_t i = 0, n = params[t].data.size(); i < n; ++i) {
      m[i] = mu * m[i] + b[i] * inv;
      p[i] -= lr * mu * m[i];
      b[i] = 0;
    }
  }
  count = 0;
}

}  // namespace loom::outer
