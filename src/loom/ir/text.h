// The IR's text form: a printer and a parser that round-trip exactly (print(parse(print(g))) ==
// print(g)). Example:
//
//   graph tiny_train {
//     param %wte : f32[256,64]
//     input %tokens : i32[4,64]
//     %x : f32[4,64,64] = embedding(%tokens, %wte)
//     %loss : f32[], %dlogits : f32[4,64,256] = cross_entropy(%logits, %targets)
//     %y : f32[4,64,64] = matmul(%x, %w) {ta = 0, tb = 1}
//     output %loss
//   }
//
// Graph inputs print first (in id order), then nodes in execution order. Attribute values are an
// integer (`3`), a float (always with `.`, `e`, `inf` or `nan`: `0.125`, `1e-05`), a string
// (`"bf16"`) or an integer list (`[1, 2]`). Floats print as the shortest text that reads back to
// the same double.
#pragma once

#include <functional>
#include <string>
#include <string_view>

#include "loom/ir/graph.h"

namespace loom::ir {

std::string print(const Graph& g);
// The same, with annotate(value id) written right after each value's type (the sharded stage prints
// shardings there: `f32[4,64]{data,_}`). Text with annotations is for reading; parse() rejects it.
std::string print(const Graph& g, const std::function<std::string(int)>& annotate);
// Throws loom::Error naming `source` (a file name or "<text>") and the line on malformed text.
// Checks syntax and that every used value is defined; types are taken as written (run the verifier
// to check them against the ops).
Graph parse(std::string_view text, const std::string& source = "<text>");

}  // namespace loom::ir
