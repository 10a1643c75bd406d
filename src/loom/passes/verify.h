// The verifier the pipeline runs after every pass: what a stage promises about a Compilation.
//
//   forward, train   the global graph passes ops::verify (every op known, types as the ops infer
//                    them, inputs defined before use, in-place inputs dead after)
//   sharded          + every value has a sharding over mesh axes that divides its shape (checked
//                    after the sharded stage's passes, which make the shardings; later passes
//                    only read them)
//   lowered          + the per-rank program passes ops::verify, and every global output and kept
//                    value maps to one of its values
//
// Returns diagnostics (empty: valid), each naming the offending node, value or axis.
#pragma once

#include <string>
#include <vector>

#include "loom/passes/pass.h"

namespace loom::passes {

std::vector<std::string> verify(const Compilation& c, const Options& opts, Stage stage);

}  // namespace loom::passes
