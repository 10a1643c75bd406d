// The IR text parser (`loom inspect`, the golden IR files). Beyond "an Error or a graph", it checks
// the parser's promise: a graph it accepts prints as text that parses back to the same print.
#include "fuzz/fuzz.h"
#include "loom/ir/text.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  loom::fuzz::guard([&] {
    const loom::ir::Graph g = loom::ir::parse(loom::fuzz::as_text(data, size), "<fuzz>");
    const std::string once = loom::ir::print(g);
    const std::string twice = loom::ir::print(loom::ir::parse(once, "<printed>"));
    if (once != twice) {
      std::fprintf(stderr, "print(parse(print(g))) != print(g):\n%s\n---\n%s\n", once.c_str(),
                   twice.c_str());
      std::abort();
    }
  });
  return 0;
}
