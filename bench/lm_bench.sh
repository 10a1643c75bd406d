#!/usr/bin/env bash
# Loom against its peer (PyTorch eager, Debian's 1.13) on the same model, batch and threads, in one run:
#   bench/lm_bench.sh [CONFIG] [THREADS] [ROUNDS]
# Alternates the two programs ROUNDS times per dtype (f32, bf16) so both see the same machine load, and
# prints one JSON line per run (Loom's `loom bench` line, the peer's line). Compare medians of ratios.
set -euo pipefail
cd "$(dirname "$0")/.."
config=${1:-configs/bench-llama.toml}
threads=${2:-2}
rounds=${3:-3}
loom=build/release/tools/loom/loom
[[ -x $loom ]] || { echo "build first: scripts/setup.sh" >&2; exit 1; }
export OMP_NUM_THREADS=$threads
for dtype in f32 bf16; do
  for ((r = 0; r < rounds; r++)); do
    $loom bench "$config" --steps 10 --warmup 2 --set model.dtype=$dtype
    /usr/bin/python3 bench/peer/torch_lm.py "$config" --dtype $dtype --threads "$threads" --steps 10 --warmup 2
  done
done
