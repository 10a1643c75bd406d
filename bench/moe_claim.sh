#!/usr/bin/env bash
# The MoE and NormFormer papers' claims at small scale, on the default corpus (scripts/quickstart.sh
# prepares it): the quickstart Llama (4.0M parameters, bf16) against
#   moe        8 experts of half its MLP width, top 2, dropless: the same matmul FLOPs per token
#              ("Efficient Large Scale Language Modeling with Mixtures of Experts": an MoE matches a
#              dense model with far less compute, so at equal compute it should reach a lower loss)
#   normformer its NormFormer version (Shleifer et al.: the same perplexity sooner)
# each trained for STEPS steps on the same batches, validation every 100 steps, once per seed
# (`train.seed`: the initial weights and the batches' order).
#   bench/moe_claim.sh [STEPS] [OUT] [SEEDS] [VARIANTS]
#   (defaults: 3000 steps, runs/moe-claim, seeds "0", variants "dense moe normformer")
# Prints one JSON line per run (final and best validation cross-entropy, the last train
# cross-entropy, median tokens/s), then, per variant other than dense with more than one seed, the
# paired difference of final validation loss against dense (median and range over the seeds), and
# writes OUT/report.html with the validation curves overlaid (loom report).
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-3000}
out=${2:-runs/moe-claim}
seeds=${3:-0}
variants=${4:-dense moe normformer}
loom=${LOOM:-build/release/tools/loom/loom}  # LOOM: another binary (a copy, while rebuilding)
[[ -x $loom ]] || { echo "build first: scripts/setup.sh" >&2; exit 1; }
[[ -f data/gutenberg-bpe2048/meta.json ]] || { echo "prepare the corpus: scripts/quickstart.sh" >&2; exit 1; }
export OMP_WAIT_POLICY=passive
common=(--set train.steps="$steps" --set train.eval_every=100 --set train.eval_batches=16
  --set checkpoint.every=0)
declare -A variant=(
  [dense]=""
  [moe]="model.moe={experts=8,top_k=2,dropless=true} model.ffn_hidden=344"
  [normformer]="model.normformer=true"
)
runs=()
lines=$(mktemp)
trap 'rm -f "$lines"' EXIT
for seed in $seeds; do
for name in $variants; do
  [[ -v "variant[$name]" ]] || { echo "moe_claim: unknown variant $name (dense moe normformer)" >&2; exit 1; }
  sets=(--set train.seed="$seed")
  for s in ${variant[$name]}; do sets+=(--set "$s"); done
  run=$out/$name-seed$seed
  [[ $seeds == 0 ]] && run=$out/$name  # one seed: the run names of earlier reports
  rm -rf "$run"
  $loom train configs/quickstart.toml --run-dir "$run" "${common[@]}" "${sets[@]}" >/dev/null
  runs+=("$run")
  python3 - "$run" "$name" "$seed" <<'EOF' | tee -a "$lines"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl") if l.strip()]
val = [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r]
print(json.dumps({"run": sys.argv[2], "seed": int(sys.argv[3]), "steps": rows[-1]["step"],
                  "final_val": val[-1][1],
                  "best_val": min(v for _, v in val),
                  "final_train_ce": rows[-1].get("ce_loss", rows[-1]["loss"]),
                  "median_tokens_per_s": statistics.median(r["tokens_per_s"] for r in rows)}))
EOF
done
done
python3 - "$lines" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
dense = {r["seed"]: r["final_val"] for r in rows if r["run"] == "dense"}
for name in dict.fromkeys(r["run"] for r in rows if r["run"] != "dense"):
    diffs = [(r["final_val"] - dense[r["seed"]]) / dense[r["seed"]] for r in rows
             if r["run"] == name and r["seed"] in dense]
    if len(diffs) > 1:
        print(json.dumps({"variant": name, "seeds": len(diffs),
                          "final_val_vs_dense_median": statistics.median(diffs),
                          "min": min(diffs), "max": max(diffs)}))
EOF
$loom report "${runs[@]}" --out "$out/report.html" >/dev/null
echo "report: $out/report.html"
