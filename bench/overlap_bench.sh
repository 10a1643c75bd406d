#!/usr/bin/env bash
# Communication under computation, on a network-bound link: `fsdp` on 2 ranks x 1 thread over TCP
# between two "hosts" (network namespaces joined by a veth pair), the link's rate limited by tc's
# token bucket filter (tbf) on both ends, with Loom's scheduled-stage passes off (every collective
# unbucketed and synchronous: what Loom ran before them) and on (bucket = "block", prefetch), at each
# rate of a sweep; then, on shared memory (no link), `data` against `fsdp` with the passes on.
#
#   bench/overlap_bench.sh [CONFIG] [ROUNDS] [RATES]     (root; RATES e.g. "0.5 1 2 5 unlimited")
#
# Environment: STEPS, WARMUP (loom bench's; 4 and 1); VARIANTS (default "off on"; also "bucket":
# bucketed but synchronous, "on1": one collective in flight, "once": on, each parameter gathered
# once per step; "on16": on with model.dtype = bf16, "red16": on16 with gradients reduced in bf16
# ([passes] reduce_dtype)); MTU (the veth's, 9000 unless set); TBF_LATENCY (tbf's queue bound, 100ms);
# SHM=0 skips the shared-memory runs; LOOM=BINARY runs that loom (an A/B against another build);
# COMM_BENCH=1 first measures each rate's collective bandwidth with bench/comm_bench (to stderr);
# TRACE_DIR=D writes each run's Chrome trace (loom bench --trace) into D;
# CALIBRATE="BASE OUT" first measures the link (at the first rate) as level "tcp" of cluster file
# BASE with `loom calibrate --level tcp` through the same launcher, into OUT.
#
# Every run prints loom bench's JSON line with "link_gbit" and "variant" added (both variants of a
# rate alternate within a round, so they see the same machine load); the last line is the summary:
# per rate, the median tokens/s of each variant, their ratio, and the exposed-communication fraction
# (exposed_comm_ms over the median step: time the compute thread spent blocked on collectives).
#
#   root namespace   (nothing: the veth pair joins the namespaces directly)
#   lovA<PID>        eth0 10.213.78.1   mpirun, rank 0     tbf on egress
#   lovB<PID>        eth0 10.213.78.2   orted, rank 1      tbf on egress
#
# Everything made here is removed on exit, failure or interrupt included.
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=$PWD
# shellcheck source=../scripts/netns.sh
source "$SRC/scripts/netns.sh"
config=${1:-configs/bench-llama.toml}
rounds=${2:-2}
rates=${3:-"0.5 1 2 5 unlimited"}
steps=${STEPS:-4}
warmup=${WARMUP:-1}
loom=${LOOM:-$SRC/build/release/tools/loom/loom}
die() { echo "overlap_bench: $*" >&2; exit 1; }
[[ $(id -u) -eq 0 ]] || die "must run as root: it creates network namespaces and veths"
[[ -x $loom ]] || die "build first: scripts/setup.sh"
[[ -f $config ]] || die "no config $config"
config=$(realpath "$config")
for tool in ip tc mpirun python3 timeout; do
  command -v "$tool" >/dev/null || die "$tool not found on PATH"
done

NET=10.213.78
NS_A=lovA$$
NS_B=lovB$$
TMP=$(mktemp -d /tmp/loom_overlap.XXXXXX)
netns_cleanup_on_exit "$TMP" "$NS_A" "$NS_B"

# --- the link ---
netns_pair "$NS_A" "$NS_B" "$NET" "${MTU:-9000}" || die "cannot join $NS_A and $NS_B"
# a TCP round trip from A to B before MPI uses the link
netns_reachable "$NS_A" "$NS_B" "$NET.2" ||
  die "namespace $NS_A cannot reach $NET.2 in $NS_B over the veth pair"

set_rate() {  # set_rate GBIT|unlimited: tbf on both ends' egress (scripts/netns.sh: netns_rate)
  netns_rate "$1" "${TBF_LATENCY:-100ms}" "$NS_A" "$NS_B" || die "tc cannot limit the link to $1 Gbit/s"
}

# --- the launcher: Open MPI's rsh agent runs a host's command line in its namespace ---
AGENT=$TMP/agent
netns_agent "$AGENT" "" "$NET.1" "$NS_A" "$NET.2" "$NS_B"
printf '%s slots=1\n%s slots=1\n' "$NET.1" "$NET.2" >"$TMP/hostfile"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# ob1 over tcp and self only: shared memory would bypass the link
# shellcheck disable=SC2054  # tcp,self is one argument
over_link=(ip netns exec "$NS_A" mpirun --allow-run-as-root --bind-to none -np 2
           --hostfile "$TMP/hostfile" --mca plm_rsh_agent "$AGENT"
           --mca pml ob1 --mca btl tcp,self
           --mca btl_tcp_if_include "$NET.0/24" --mca oob_tcp_if_include "$NET.0/24"
           -x OMP_NUM_THREADS -x OMP_WAIT_POLICY -x PATH
           -x OMPI_ALLOW_RUN_AS_ROOT -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM)
on_shm=(mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2
        -x OMP_NUM_THREADS -x OMP_WAIT_POLICY)

data='[{kind="data",axis="data"}]'
fsdp='[{kind="fsdp",axis="data"},{kind="data",axis="data"}]'
# VARIANTS (default "off on") picks among these; the summary's speedup is on over off
declare -A passes=(
  [off]="--set passes.bucket=none --set passes.prefetch=false"
  [bucket]="--set passes.bucket=block --set passes.prefetch=false"
  [on]="--set passes.bucket=block --set passes.prefetch=true"
  [on1]="--set passes.bucket=block --set passes.prefetch=true --set passes.max_in_flight=1"
  [once]="--set passes.bucket=block --set passes.prefetch=true --set passes.reshard_after_forward=false"
  [on16]="--set passes.bucket=block --set passes.prefetch=true --set model.dtype=bf16"
  [red16]="--set passes.bucket=block --set passes.prefetch=true --set model.dtype=bf16 --set passes.reduce_dtype=bf16")
variants=${VARIANTS:-off on}
shm=${SHM:-1}
log=$TMP/log
bench() {  # bench LABEL-JSON LAUNCHER... -- PLAN VARIANT
  local extra=$1 plan=$2 variant=$3
  shift 3
  local out
  # shellcheck disable=SC2086  # the variant's --set pairs split into words
  local trace=()
  [[ -n ${TRACE_DIR:-} ]] &&
    trace=(--trace "$(realpath "$TRACE_DIR")/$(echo "$extra" | tr -dc 'a-z0-9.').json")
  out=$(timeout 900 "$@" "$loom" bench "$config" --steps "$steps" --warmup "$warmup" \
    --set 'plan.mesh={data=2}' --set "plan.tactics=${!plan}" ${passes[$variant]} "${trace[@]}") ||
    die "loom bench ($plan, passes $variant, $extra) failed"
  python3 -c 'import json, sys
j = json.loads(sys.argv[1].strip().splitlines()[-1]); j.update(json.loads(sys.argv[2]))
print(json.dumps(j))' "$out" "$extra" | tee -a "$log"
}

veth_bytes() { ip netns exec "$NS_A" cat /sys/class/net/eth0/statistics/tx_bytes; }
if [[ -n ${CALIBRATE:-} ]]; then
  read -r cal_base cal_out <<<"$CALIBRATE"
  set_rate "${rates%% *}"
  "$loom" calibrate --level tcp --launcher "${over_link[*]}" --base "$cal_base" --out "$cal_out" \
    >&2 || die "loom calibrate --level tcp failed"
fi
for ((r = 0; r < rounds; r++)); do
  for rate in $rates; do
    set_rate "$rate"
    if [[ ${COMM_BENCH:-0} == 1 ]]; then  # the link's collective bandwidth (bench/comm_bench.cc)
      for polite in "" --polite; do
        timeout 900 "${over_link[@]}" "$SRC/build/release/bench/comm_bench" --reps 3 $polite |
          sed "s/^{/{\"link_gbit\": \"$rate\", \"polite\": \"$polite\", /" >&2
      done
    fi
    for variant in $variants; do
      before=$(veth_bytes)
      bench "{\"link_gbit\": \"$rate\", \"variant\": \"$variant\", \"plan_name\": \"fsdp\"}" \
        fsdp "$variant" "${over_link[@]}"
      sent=$(($(veth_bytes) - before))
      ((sent > 1000000)) || die "only $sent bytes crossed the link: is MPI bypassing it?"
    done
  done
  ((shm)) || continue
  for plan in data fsdp; do  # shared memory: no link
    bench "{\"link_gbit\": \"shm\", \"variant\": \"on\", \"plan_name\": \"$plan\"}" \
      "$plan" on "${on_shm[@]}"
  done
done
set_rate unlimited

python3 - "$log" <<'EOF'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
def med(xs): return statistics.median(xs) if xs else float("nan")
out = {"bench": "overlap", "config": runs[0]["config"], "steps": runs[0]["steps"], "rates": []}
for rate in dict.fromkeys(r["link_gbit"] for r in runs if r["link_gbit"] != "shm"):
    row = {"link_gbit": rate}
    for v in dict.fromkeys(r["variant"] for r in runs if r["link_gbit"] == rate):
        rs = [r for r in runs if r["link_gbit"] == rate and r["variant"] == v]
        row[v] = {"tokens_per_s": med([r["tokens_per_s"] for r in rs]),
                  "step_ms": med([r["step_ms"]["median"] for r in rs]),
                  "exposed_comm_fraction": med([r["exposed_comm_fraction"] for r in rs]),
                  "collectives_per_step": med([r["collectives_per_step"] for r in rs]),
                  "peak_rss_mb": med([max(p["peak_rss_bytes"] for p in r["per_rank"]) / 2**20
                                      for r in rs])}
    for v in ("on", "once"):
        if v in row and "off" in row:
            row["speedup_" + v] = row[v]["tokens_per_s"] / row["off"]["tokens_per_s"]
    out["rates"].append(row)
shm = {p: med([r["tokens_per_s"] for r in runs if r["link_gbit"] == "shm" and r["plan_name"] == p])
       for p in ("data", "fsdp")}
if shm["data"] == shm["data"]:  # not NaN: SHM=1
    out["shm"] = {"data_tokens_per_s": shm["data"], "fsdp_passes_tokens_per_s": shm["fsdp"],
                  "fsdp_over_data": shm["fsdp"] / shm["data"]}
print(json.dumps(out))
EOF
