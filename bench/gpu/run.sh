#!/usr/bin/env bash
# The GPU measurements behind docs/benchmarks.md#simulator's "on a GPU" section, in one go (a
# lent GPU machine's time is short): bench/gpu/torch_kernels.py times the kernels of the
# `loom plan --kernels` files in IN, then bench/gpu/torch_step.py runs the config's training step
# at each of LAYERS under each activation-checkpointing policy of ACS, while nvidia-smi logs power
# and clocks every 200 ms.
#
#   bench/gpu/run.sh IN OUT      # IN: *.json from loom plan --kernels; OUT: results
#
# Environment: PY (python3), DEVICE (cuda), CONFIG (configs/llama3.1-8b.toml), LAYERS ("2 4"),
# ACS ("selective titan"), STEP_ARGS (more torch_step.py flags, e.g. "--seq 64" for a test).
# Writes OUT/timed.json, OUT/kernels.log, OUT/steps.jsonl, OUT/gpu.txt and OUT/power.csv.
set -uo pipefail
in=${1:?usage: bench/gpu/run.sh IN OUT}
out=${2:?usage: bench/gpu/run.sh IN OUT}
py=${PY:-python3}
device=${DEVICE:-cuda}
config=${CONFIG:-configs/llama3.1-8b.toml}
here=$(dirname "$0")
mkdir -p "$out"
shopt -s nullglob
files=("$in"/*.json)
((${#files[@]})) || { echo "run.sh: no *.json in $in" >&2; exit 1; }
export PYTHONUNBUFFERED=1
smi=0
if [[ $device == cuda ]] && command -v nvidia-smi >/dev/null; then
  nvidia-smi -q >"$out/gpu.txt" 2>&1
  nvidia-smi --query-gpu=timestamp,power.draw,power.limit,clocks.sm,clocks.mem,temperature.gpu \
    --format=csv -lms 200 >"$out/power.csv" 2>&1 &
  smi=$!
else
  echo "device $device" >"$out/gpu.txt"
fi
"$py" "$here/torch_kernels.py" "${files[@]}" --out "$out/timed.json" --device "$device" \
  2>&1 | tee "$out/kernels.log"
rc=${PIPESTATUS[0]}
: >"$out/steps.jsonl"
for n in ${LAYERS:-2 4}; do
  for ac in ${ACS:-selective titan}; do
    # shellcheck disable=SC2086  # STEP_ARGS is a list of flags
    if ! timeout 240 "$py" "$here/torch_step.py" "$config" --layers "$n" --ac "$ac" \
      --device "$device" --out "$out/step.json" ${STEP_ARGS:-}; then
      echo "{\"layers\": $n, \"ac\": \"$ac\", \"error\": \"torch_step.py failed (see the log)\"}" \
        >"$out/step.json"
      rc=1
    fi
    cat "$out/step.json" >>"$out/steps.jsonl"
    echo >>"$out/steps.jsonl"
  done
done
rm -f "$out/step.json"
((smi)) && kill "$smi"
exit "$rc"
