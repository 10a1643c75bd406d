#!/usr/bin/env bash
# The quickstart: sets everything up, fetches the default corpus, trains a 2048-piece BPE tokenizer on
# it, trains a small Llama (a few minutes on 2 cores), prints a sample of generated text and writes
# the report page.
# Running it again continues (or reuses) the same run: runs/quickstart.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/fetch_corpus.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
loom=build/release/tools/loom/loom
run=runs/quickstart
if [[ ! -f data/gutenberg-bpe2048/meta.json ]]; then
  $loom data prepare --input data/gutenberg --out data/gutenberg-bpe2048 --vocab-size 2048
fi
resume=()
[[ -d $run/checkpoints ]] && resume=(--resume auto)
$loom train configs/quickstart.toml --run-dir "$run" "${resume[@]}"
echo
echo "--- sample (greedy would repeat itself; temperature 0.8, top-k 40) ---"
$loom sample "$run" --prompt "It was a dark and stormy night; " --max-tokens 400 --temperature 0.8 --top-k 40 --seed 1
echo
echo "---"
$loom report "$run"
