// The outer optimizer: what the server does with pseudo-gradients (global - local parameters).
//
// Sync (DiLoCo): once per round, on the mean pseudo-gradient g of the islands that pushed,
//   m <- mu m + g;   p <- p - lr (g + mu m)            (Nesterov, in PyTorch SGD's form)
// Async (Delayed Nesterov, Liu et al. 2024): each push g is applied as it arrives, and the momentum
// moves only every N pushes, on the mean of the pseudo-gradients buffered since:
//   b <- b + g;  c <- c + 1               (c: pushes in the open period)
//   if c >= N:  m <- mu m + b / N;  p <- p - lr (g / N + mu m);  b <- 0;  c <- 0
//   else:       p <- p - lr g / N
// N may change between pushes (the server's default N is its live islands); a period closes at
// the first push that makes c reach the N of that push, or early (delayed_nesterov_close), as if
// its last push were zero:  m <- mu m + b / N;  p <- p - lr mu m;  b <- 0;  c <- 0.
// Over N pushes this moves p as a sync round of N islands would (each gradient weighs 1/N); with
// N = 1 it is the sync update.
#pragma once

#include <cstdint>

#include "loom/outer/tensors.h"

namespace loom::outer {

struct OuterOptConfig {
  double lr = 0.7;
  double momentum = 0.9;
};

void nesterov_step(const OuterOptConfig& c, TensorList& params, TensorList& momentum,
                   const TensorList& grad);

// `count`: the pushes of the open period before this one; this push adds one, or closes the period
// (its momentum step) and sets it to 0.
void delayed_nesterov_push(const OuterOptConfig& c, int64_t period, TensorList& params,
                           TensorList& momentum, TensorList& buffer, int64_t& count,
                           const TensorList& grad);
// Closes the open period before its N-th push: its momentum step on the buffer; count <- 0.
void delayed_nesterov_close(const OuterOptConfig& c, int64_t period, TensorList& params,
                            TensorList& momentum, TensorList& buffer, int64_t& count);

}  // namespace loom::outer
