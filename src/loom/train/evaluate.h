// Validation loss as loom train reports it: the mean cross-entropy (an MoE model's auxiliary losses
// left out, so models compare by perplexity) over [train] eval_batches batches of
// batch_size rows from the validation split, sampled with seed + 7777 (the same batches every time,
// in every run of the config).
#pragma once

#include "loom/data/text_corpus.h"
#include "loom/train/config.h"
#include "loom/train/step.h"

namespace loom::train {

double validation_loss(const Config& cfg, const data::TextCorpus& corpus, StepRunner& evaluator);

}  // namespace loom::train
