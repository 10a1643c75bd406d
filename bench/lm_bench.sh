#!/usr/bin/env bash
# Loom against its peers on the same model, batch, threads and optimizer, in one run:
#   bench/lm_bench.sh [CONFIG] [THREADS] [ROUNDS]
# Peers (bench/peer/torch_lm.py): Debian's PyTorch 1.13 eager (the golden reference, always), and,
# where bench/peer/setup_venv.sh has made $LOOM_PEER_VENV, PyTorch 2.x eager and torch.compile.
# Alternates all programs ROUNDS times per dtype (f32, bf16) so they see the same machine load, prints
# every run's JSON line, then one summary line (bench/summary.py): medians, and Loom's ratio to the
# strongest peer. The peers run with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset (this machine's
# environment may set them, which slows OpenBLAS); Loom's runs and the tests keep the environment.
set -euo pipefail
cd "$(dirname "$0")/.."
config=${1:-configs/bench-llama.toml}
threads=${2:-2}
rounds=${3:-3}
loom=build/release/tools/loom/loom
[[ -x $loom ]] || { echo "build first: scripts/setup.sh" >&2; exit 1; }
export OMP_NUM_THREADS=$threads
source bench/peer/peers.sh
peer_args=(--threads "$threads" --steps 10 --warmup 2)
modes=()
[[ -n $venv_python ]] && modes=(eager compile)
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for dtype in f32 bf16; do
  for ((r = 0; r < rounds; r++)); do
    $loom bench "$config" --steps 10 --warmup 2 --set model.dtype=$dtype | tee -a "$log"
    "${peer[@]}" /usr/bin/python3 bench/peer/torch_lm.py "$config" --dtype $dtype "${peer_args[@]}" |
      tee -a "$log"
    for mode in "${modes[@]}"; do
      "${peer[@]}" "$venv_python" bench/peer/torch_lm.py "$config" --dtype $dtype --mode "$mode" \
        "${peer_args[@]}" | tee -a "$log"
    done
  done
done
python3 bench/summary.py <"$log"
