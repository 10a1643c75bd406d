#!/usr/bin/env bash
# Runs fuzz campaigns: each target's fuzzer for SECONDS from its seeds (fuzz/corpus/<t>) and the
# build tree's working corpus, and prints one JSON line per target: executions, executions per
# second, coverage (libFuzzer's edge count `cov` and feature count `ft`), corpus size, peak RSS and
# the inputs it broke the target with (saved under build/fuzz/fuzz-artifacts/<t>/; each becomes a
# regression input in fuzz/regressions/<t>/ once its cause is fixed).
#
# Usage: fuzz/run.sh [SECONDS] [TARGET...]     (default: 600 s, every target)
#   JOBS=N runs N fuzzers at once (default 1); the log of each is build/fuzz/fuzz-logs/<t>.log.
# Needs the fuzz build: cmake --preset fuzz && cmake --build --preset fuzz
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-600}
shift || true
targets=("$@")
if ((${#targets[@]} == 0)); then
  targets=(config safetensors token_shard checkpoint_state ir_text outer_requests metrics)
fi
build=build/fuzz
[[ -x $build/fuzz/fuzz_${targets[0]} ]] || {
  echo "fuzz/run.sh: no $build/fuzz/fuzz_${targets[0]}: cmake --preset fuzz && cmake --build --preset fuzz" >&2
  exit 2
}
mkdir -p "$build/fuzz-logs"

one() {
  local t=$1 log=$build/fuzz-logs/$1.log
  local work=$build/fuzz-corpus/$t artifacts=$build/fuzz-artifacts/$t
  mkdir -p "$work" "$artifacts"
  touch "$log.start"  # findings are the artifacts written after it
  local rc=0
  "$build/fuzz/fuzz_$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
    -print_final_stats=1 -close_fd_mask=1 -artifact_prefix="$artifacts/" \
    "$work" "fuzz/corpus/$t" fuzz/regressions/"$t" >"$log" 2>&1 || rc=$?
  local done_line
  done_line=$(grep -E '^#[0-9]+[[:space:]]+(DONE|pulse|NEW|REDUCE|INITED)' "$log" | tail -1 || true)
  stat() { grep -oP "^stat::$1: *\K[0-9]+" "$log" || echo null; }
  local line
  line=$(printf '{"target": "%s", "seconds": %s, "exit": %d, "executions": %s, "execs_per_s": %s, ' \
    "$t" "$seconds" "$rc" "$(stat number_of_executed_units)" "$(stat average_exec_per_sec)")
  line+=$(printf '"cov": %s, "ft": %s, "corpus": %s, "new_units": %s, "peak_rss_mb": %s, "findings": %d}' \
    "$(grep -oP 'cov: \K[0-9]+' <<<"$done_line" || echo null)" \
    "$(grep -oP 'ft: \K[0-9]+' <<<"$done_line" || echo null)" \
    "$(ls "$work" | wc -l)" "$(stat new_units_added)" "$(stat peak_rss_mb)" \
    "$(find "$artifacts" -type f -newer "$log.start" | wc -l)")
  echo "$line"
}

jobs=${JOBS:-1}
for t in "${targets[@]}"; do
  while (($(jobs -rp | wc -l) >= jobs)); do wait -n || true; done
  one "$t" &
done
wait
