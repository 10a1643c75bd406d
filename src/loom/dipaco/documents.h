// Documents of a corpus split as DiPaCo's routing and evaluation read them (route.h).
#pragma once

#include <cstdint>
#include <vector>

#include "loom/data/text_corpus.h"

namespace loom::dipaco {

// Each document's first `n` tokens (fewer if it is shorter); `starts` from document_starts.
std::vector<std::vector<int32_t>> heads(const data::TextCorpus& c, data::TextCorpus::Split s,
                                        const std::vector<int64_t>& starts, int64_t n);
// Whether document i of a split is held out: every `every`-th (none when every is 0).
bool held_out(size_t i, int64_t every);

}  // namespace loom::dipaco
