#include "loom/train/evaluate.h"

#include <vector>

namespace loom::train {

double validation_loss(const Config& cfg, const data::TextCorpus& corpus, StepRunner& evaluator) {
  const int64_t B = cfg.train.batch_size, T = cfg.train.seq_len;
  std::vector<int32_t> tokens(size_t(B * (T + 1)));
  double sum = 0;
  for (int64_t i = 0; i < cfg.train.eval_batches; ++i) {
    corpus.sample(data::TextCorpus::Split::val, uint64_t(cfg.train.seed) + 7777, i, 0, B, T,
                  tokens.data());
    evaluator.step(tokens.data());
    sum += evaluator.ce_loss();
  }
  return sum / double(cfg.train.eval_batches);
}

}  // namespace loom::train
