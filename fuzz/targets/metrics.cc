// `loom report`: metrics.jsonl read into rows, and the rows rendered (one run, and a comparison).
#include "fuzz/fuzz.h"
#include "loom/report/report.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = loom::fuzz::put_file("metrics.jsonl", loom::fuzz::as_text(data, size));
  loom::fuzz::guard([&] {
    const auto m = loom::report::read_metrics(path);
    const auto& rows = m.rows;
    if (m.skipped > 0 && m.first_skip.empty()) std::abort();
    if (rows.empty()) return;
    const std::string config = "[model]\narch = \"<llama>\"\n";
    (void)loom::report::render("run & <dir>", rows, &config);
    (void)loom::report::render_compare({"a", "b"}, {rows, rows});
  });
  return 0;
}
