#!/usr/bin/env bash
# Two loom binaries on the same config, threads and machine load: a change's speed against the
# code before it. Alternates `loom bench` of A and B ROUNDS times per dtype (f32, bf16), in the order
# AB BA AB ... so neither always runs first, prints every run's JSON line (tagged "build": "a" or
# "b"), then one summary line per dtype: the median tokens/s of each and B's ratio to A.
#   bench/ab_bench.sh A_LOOM B_LOOM [CONFIG] [ROUNDS] [THREADS]
# e.g. build the commit before a change into /tmp/before, then
#   bench/ab_bench.sh /tmp/before/loom build/release/tools/loom/loom configs/bench-llama.toml 3
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $# -ge 2 ]] || { sed -n 2,8p "$0" >&2; exit 2; }
a=$1 b=$2 config=${3:-configs/bench-llama.toml} rounds=${4:-3} threads=${5:-2}
for x in "$a" "$b"; do [[ -x $x ]] || { echo "ab_bench: $x is not an executable" >&2; exit 2; }; done
export OMP_NUM_THREADS=$threads
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for dtype in f32 bf16; do
  for ((r = 0; r < rounds; r++)); do
    order="a b"
    ((r % 2)) && order="b a"
    for tag in $order; do
      bin=$a
      [[ $tag == b ]] && bin=$b
      "$bin" bench "$config" --steps 10 --warmup 2 --set model.dtype=$dtype |
        python3 -c 'import json,sys; d=json.loads(sys.stdin.readline()); d["build"]=sys.argv[1]; print(json.dumps(d))' "$tag" |
        tee -a "$log"
    done
  done
done
python3 - "$log" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
for dtype in ("f32", "bf16"):
    med = {t: statistics.median(r["tokens_per_s"] for r in runs if r["dtype"] == dtype and r["build"] == t)
           for t in ("a", "b")}
    print(json.dumps({"summary": "ab", "config": runs[0]["config"], "dtype": dtype,
                      "runs_each": sum(1 for r in runs if r["dtype"] == dtype and r["build"] == "a"),
                      "a_tokens_per_s": round(med["a"], 1), "b_tokens_per_s": round(med["b"], 1),
                      "b_over_a": round(med["b"] / med["a"], 4)}))
PY
