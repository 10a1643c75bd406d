// The run report's reading and rendering: metrics.jsonl, as `loom train` appends it, into rows;
// rows (and a run's config.toml) into one self-contained HTML page of inline SVG plots. `loom
// report` (tools/loom/report.cc) is the command around it; fuzz/ drives the reader and renderer
// directly.
//
// Invariant: any file renders. A line that is not a metrics object is skipped with a count and the
// first one named; any finite or non-finite value (NaN, ±inf, 1e308, denormals) plots or prints as
// "&mdash;", never an exception or an abort.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace loom::report {

// One metrics.jsonl line. A field that is absent or null (JSON has no NaN) is NaN and not plotted.
struct Row {
  int64_t step = 0;
  double loss = NAN, lr = NAN, grad_norm = NAN, tokens_per_s = NAN, val_loss = NAN;
  // MoE models (loop.cc): the cross-entropy alone and the router's load
  double ce_loss = NAN, moe_tokens_max = NAN, moe_tokens_mean = NAN, moe_dropped = NAN;
};

// metrics.jsonl parsed: rows sorted by step (a duplicated step keeps its last line), and what was
// skipped. Blank lines are skipped silently, and so is a torn last line (not JSON: a write a crash
// cut short); any other line that is not a metrics object (not JSON, no integer "step", a "loss"
// that is not a number) is skipped and counted, the first one named by path:line and reason.
struct Metrics {
  std::vector<Row> rows;
  size_t skipped = 0;
  std::string first_skip;  // "<path>:<line>: <reason>", when skipped > 0
};
// Throws loom::Error only when the file cannot be read.
Metrics read_metrics(const std::string& path);

// One run's page: a summary of `rows` (at least one), the plots, and `config` when given.
std::string render(const std::string& title, const std::vector<Row>& rows,
                   const std::string* config);

// Several runs on one page (each with at least one row): a summary row per run and their train
// and validation losses overlaid.
std::string render_compare(const std::vector<std::string>& names,
                           const std::vector<std::vector<Row>>& runs);

}  // namespace loom::report
