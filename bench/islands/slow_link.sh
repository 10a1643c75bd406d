#!/usr/bin/env bash
# Islands behind a slow link: the outer server in one network namespace, 4 islands in another, the
# veth pair between them rate-limited by tc's token bucket filter on both ends. Plain DiLoCo against
# streaming DiLoCo (4 fragments), with f32 and int4 pushes, with and without an overlap, at each rate
# of a sweep: what the fragments' lower peak and the overlap do to wall time once the link, not the
# compute, is what a round waits on.
#
#   bench/islands/slow_link.sh [RATES] [STEPS]     (root; RATES in Mbit/s, e.g. "20 100 unlimited")
#
# The model is configs/tiny-llama.toml with 4 layers (217,664 parameters), byte-level on the
# Gutenberg text; H = 32; outer lr 1.0, momentum 0.5; each island one process with one thread.
# Every run prints a JSON line: the variant, the rate, the wall time of the slowest island, the
# final validation loss (island 0's last evaluation: after the last step's flush every island holds
# the global parameters), island 0's time waiting on the outer server, and the bytes the islands
# moved; the last line sums up the wall times per rate against plain DiLoCo's.
#
#   root namespace   (nothing: the veth pair joins the namespaces directly)
#   lslS<PID>        eth0 10.213.79.1   loom outer-server       tbf on egress
#   lslI<PID>        eth0 10.213.79.2   4 x loom train (islands) tbf on egress
#
# Everything made here is removed on exit, failure or interrupt included.
set -euo pipefail
cd "$(dirname "$0")/../.."
SRC=$PWD
# shellcheck source=../../scripts/netns.sh
source "$SRC/scripts/netns.sh"
rates=${1:-"20 100 unlimited"}
steps=${2:-320}
loom=$SRC/build/release/tools/loom/loom
die() { echo "slow_link: $*" >&2; exit 1; }
[[ $(id -u) -eq 0 ]] || die "must run as root: it creates network namespaces and veths"
[[ -x $loom ]] || die "build first: scripts/setup.sh"
for tool in ip tc python3 timeout; do
  command -v "$tool" >/dev/null || die "$tool not found on PATH"
done

NET=10.213.79
NS_S=lslS$$
NS_I=lslI$$
TMP=$(mktemp -d /tmp/loom_slow_link.XXXXXX)
netns_cleanup_on_exit "$TMP" "$NS_S" "$NS_I"

netns_pair "$NS_S" "$NS_I" "$NET" || die "cannot join $NS_S and $NS_I"
netns_reachable "$NS_I" "$NS_S" "$NET.1" ||
  die "namespace $NS_I cannot reach $NET.1 in $NS_S over the veth pair"

set_rate() {  # set_rate MBIT|unlimited: tbf on both ends' egress, a burst of 10 ms of traffic
  local rate=$1 ns burst=0 spec=unlimited
  if [[ $rate != unlimited ]]; then
    burst=$(python3 -c "print(max(int(float('$rate') * 1e6 / 8 / 100), 16384))")
    spec=${rate}mbit
  fi
  for ns in "$NS_S" "$NS_I"; do
    netns_tbf "$ns" "$spec" "$burst" 200ms || die "tc cannot limit $ns's eth0 to $spec"
  done
}

export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
LOOM_OUTER_TOKEN=${LOOM_OUTER_TOKEN:-$(python3 -c 'import os; print(os.urandom(16).hex())')}
export LOOM_OUTER_TOKEN
common=(--set model.n_layers=4 --set "data.path=$SRC/data/gutenberg" --set train.eval_batches=16
        --set train.warmup_steps=100 --set "train.steps=$steps" --set train.eval_every=0
        --set outer.inner_steps=32 --set outer.lr=1.0 --set outer.momentum=0.5
        --set outer.islands=4 --set outer.retry_s=60)
declare -A variants=(
  [plain]=""
  [f4]="--set outer.fragments=4"
  [f4-int4]="--set outer.fragments=4 --set outer.compress=\"int4\""
  [f4-int4-tau2]="--set outer.fragments=4 --set outer.compress=\"int4\" --set outer.overlap=2"
)
order=(plain f4 f4-int4 f4-int4-tau2)
results=$TMP/results.jsonl

run() {  # run VARIANT RATE
  local v=$1 rate=$2 d=$TMP/$1-$2 port i
  mkdir -p "$d"
  # shellcheck disable=SC2086  # the variant's --set pairs split into words
  ip netns exec "$NS_S" timeout 1800 "$loom" outer-server configs/tiny-llama.toml \
    --listen "$NET.1:0" --state-dir "$d/server" --port-file "$d/port" "${common[@]}" \
    ${variants[$v]} >"$d/server.log" 2>&1 &
  local server=$!
  for ((i = 0; i < 300; i++)); do
    [[ -s $d/port ]] && break
    sleep 0.1
  done
  [[ -s $d/port ]] || die "the outer server did not start: $(tail -3 "$d/server.log")"
  port=$(cat "$d/port")
  local t0 pids=()
  t0=$(date +%s.%N)
  for i in 0 1 2 3; do
    # shellcheck disable=SC2086
    ip netns exec "$NS_I" timeout 1800 "$loom" train configs/tiny-llama.toml \
      --run-dir "$d/island_$i" --set "outer.server=$NET.1:$port" "${common[@]}" \
      ${variants[$v]} >"$d/island_$i.log" 2>&1 &
    pids+=($!)
  done
  for i in 0 1 2 3; do
    wait "${pids[$i]}" || die "island $i of $v at $rate failed: $(tail -3 "$d/island_$i.log")"
  done
  local wall
  wall=$(python3 -c "import time; print(round(time.time() - $t0, 2))")
  kill -TERM "$server"
  wait "$server" || true
  python3 - "$d" "$v" "$rate" "$wall" >>"$results" <<'EOF'
import json, sys
d, v, rate, wall = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
last, sent, received = {}, 0, 0
for i in range(4):
    lines = [json.loads(l) for l in open(f"{d}/island_{i}/metrics.jsonl")]
    outer = [l for l in lines if "outer_round" in l][-1]
    sent += outer["bytes_sent"]
    received += outer["bytes_received"]
    if i == 0:
        last = lines[-1]
        wait = outer["wait_s"]
print(json.dumps({"variant": v, "rate_mbit": rate, "wall_s": wall, "val_loss": last["val_loss"],
                  "wait_s_island0": round(wait, 2), "bytes_sent": sent,
                  "bytes_received": received}))
EOF
  tail -1 "$results"
}

for rate in $rates; do
  set_rate "$rate"
  for v in "${order[@]}"; do
    run "$v" "$rate"
  done
done
python3 - "$results" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
out = {}
for r in rows:
    base = next(x for x in rows if x["rate_mbit"] == r["rate_mbit"] and x["variant"] == "plain")
    out.setdefault(r["rate_mbit"], {})[r["variant"]] = {
        "wall_s": r["wall_s"], "vs_plain": round(r["wall_s"] / base["wall_s"], 3),
        "val_loss": round(r["val_loss"], 4), "wait_s_island0": r["wait_s_island0"]}
print(json.dumps({"summary": out}))
EOF
