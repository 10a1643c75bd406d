#!/usr/bin/env bash
# loom train with an fsdp plan on two "hosts": two network namespaces joined by a Linux bridge, the
# ranks launched by mpirun through an rsh agent, MPI traffic forced onto TCP across the bridge. The
# losses must equal the one-process run's at every step (f32, within 1e-5 relative). Then four
# ranks, two a host: megatron within each host and fsdp across, the same losses.
#
#   root namespace      lbr<PID> (bridge, no address)
#                        |                 |
#                       lvA<PID>          lvB<PID>          (veth, bridge side)
#                        |                 |
#   loomA<PID>          eth0 10.213.77.1  |                 mpirun, rank 0
#   loomB<PID>                            eth0 10.213.77.2  orted, rank 1
#
# The addresses live only inside the two namespaces made here (the bridge has none), so the subnet
# can collide neither with the machine's networks nor with another run of this test.
#
# Open MPI calls the agent as `AGENT HOST orted ARGS...`, ARGS already quoted for a remote shell (as
# ssh would run it); the agent runs that line with sh -c in HOST's namespace.
#
# Checked: each rank runs in its own namespace; the veth counters show the training traffic crossing
# the bridge both ways; all 20 steps are logged and match. A rank that cannot start fails the test;
# nothing is skipped. Everything made here is removed on exit, failure included.
#
#   two_host_test.sh [LOOM_BINARY [SOURCE_DIR]]   (must run as root)
set -euo pipefail

die() { echo "FAIL two_host: $*" >&2; exit 1; }

SRC=${2:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
LOOM=${1:-$SRC/build/release/tools/loom/loom}
[[ $(id -u) -eq 0 ]] || die "must run as root: it creates network namespaces, a bridge and veths"
for tool in ip mpirun python3 timeout; do
  command -v "$tool" >/dev/null || die "$tool not found on PATH"
done
[[ -x $LOOM ]] || die "loom binary $LOOM is not an executable file"
LOOM=$(realpath "$LOOM")
SRC=$(realpath "$SRC")
CONFIG=$SRC/configs/tiny-llama.toml
[[ -f $CONFIG ]] || die "no $CONFIG (is $SRC the source dir?)"
# shellcheck source=../scripts/netns.sh
source "$SRC/scripts/netns.sh"

STEPS=20
NET=10.213.77
IP_A=$NET.1
IP_B=$NET.2
NS_A=loomA$$
NS_B=loomB$$
BR=lbr$$            # interface names are at most 15 characters; a PID has at most 7 digits
VETH_A=lvA$$
VETH_B=lvB$$
TMP=$(mktemp -d /tmp/loom_two_host.XXXXXX)

CHILD=
# bounded SECONDS LOG CMD...: CMD under timeout, output to LOG, waited for in the background so that
# a signal to this script is handled at once (bash defers traps while a foreground child runs).
bounded() {
  timeout "$1" "${@:3}" >"$2" 2>&1 &
  CHILD=$!
  local rc=0
  wait "$CHILD" || rc=$?
  CHILD=
  return $rc
}

kill_ns_procs() {  # kill_ns_procs NS: TERM, then after at most 5 s KILL, what still runs in NS
  local ns=$1 pids i
  mapfile -t pids < <(ip netns pids "$ns" 2>/dev/null)
  ((${#pids[@]})) || return 0
  kill -TERM "${pids[@]}" 2>/dev/null || true
  for ((i = 0; i < 50; i++)); do
    mapfile -t pids < <(ip netns pids "$ns" 2>/dev/null)
    ((${#pids[@]})) || return 0
    sleep 0.1
  done
  kill -KILL "${pids[@]}" 2>/dev/null || true
}

cleanup() {
  local rc=$?
  set +e
  trap - EXIT INT TERM HUP
  if [[ -n $CHILD ]]; then  # interrupted: timeout passes the TERM on to mpirun, which ends its job
    kill -TERM "$CHILD" 2>/dev/null
    for ((i = 0; i < 50; i++)); do kill -0 "$CHILD" 2>/dev/null || break; sleep 0.1; done
  fi
  for ns in "$NS_A" "$NS_B"; do
    if [[ -e /run/netns/$ns ]]; then
      kill_ns_procs "$ns"
      ip netns del "$ns"  # takes the namespace's veth end, and so the pair, with it
    fi
  done
  for link in "$VETH_A" "$VETH_B" "$BR"; do
    ip link show "$link" >/dev/null 2>&1 && ip link del "$link"
  done
  rm -rf "$TMP"
  exit $rc
}
trap cleanup EXIT
for sig in INT:130 TERM:143 HUP:129; do
  # shellcheck disable=SC2064  # the signal's name and status, expanded now
  trap "echo 'FAIL two_host: interrupted by SIG${sig%:*}' >&2; exit ${sig#*:}" "${sig%:*}"
done

# --- the network: two namespaces on one bridge ---
ip link add "$BR" type bridge || die "cannot create bridge $BR"
ip link set "$BR" up
for side in A B; do
  ns_var=NS_$side veth_var=VETH_$side ip_var=IP_$side
  ns=${!ns_var} veth=${!veth_var} addr=${!ip_var}
  ip netns add "$ns" || die "cannot create network namespace $ns"
  ip link add "$veth" type veth peer name eth0 netns "$ns" || die "cannot create veth $veth"
  ip link set "$veth" master "$BR" up
  ip -n "$ns" addr add "$addr/24" dev eth0
  ip -n "$ns" link set lo up
  ip -n "$ns" link set eth0 up
done

# A plain TCP connection from A to B first, so that a bridge that drops traffic (br_netfilter with a
# DROP forward policy) is reported as such and not as an MPI hang.
netns_reachable "$NS_A" "$NS_B" "$IP_B" ||
  die "namespace $NS_A cannot reach $IP_B in $NS_B over bridge $BR (is bridged traffic" \
      "filtered? see net.bridge.bridge-nf-call-iptables)"

# --- the launcher: an rsh agent that maps a host (its IP) to its namespace ---
AGENT=$TMP/agent
netns_agent "$AGENT" "$TMP/agent.log" "$IP_A" "$NS_A" "$IP_B" "$NS_B"
printf '%s slots=1\n%s slots=1\n' "$IP_A" "$IP_B" >"$TMP/hostfile"

export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# ob1 over tcp and self only: no vader (shared memory would work between namespaces of one machine
# and bypass the bridge), no UCX.
# shellcheck disable=SC2054  # tcp,self is one argument
MPIRUN=(ip netns exec "$NS_A"
        mpirun --allow-run-as-root --bind-to none -np 2
        --hostfile "$TMP/hostfile" --mca plm_rsh_agent "$AGENT"
        --mca pml ob1 --mca btl tcp,self
        --mca btl_tcp_if_include "$NET.0/24" --mca oob_tcp_if_include "$NET.0/24"
        -x OMP_NUM_THREADS -x OMP_WAIT_POLICY -x PATH
        -x OMPI_ALLOW_RUN_AS_ROOT -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM)

bridge_bytes() {  # bytes A has sent and received: the bridge-side veth's rx and tx
  local stats=/sys/class/net/$VETH_A/statistics
  echo "$(<"$stats/rx_bytes") $(<"$stats/tx_bytes")"
}

# --- each rank in its own namespace ---
netns_id() { echo "net:[$(stat -L -c %i "/run/netns/$1")]"; }
read -r rx0 tx0 < <(bridge_bytes)
# shellcheck disable=SC2016  # expanded by the rank's shell
bounded 60 "$TMP/where.log" \
  "${MPIRUN[@]}" sh -c 'echo "rank $OMPI_COMM_WORLD_RANK $(readlink /proc/self/ns/net)"' ||
  die "mpirun could not start a rank in each namespace (exit $?): $(tail -c 3000 "$TMP/where.log")"
read -r rx1 tx1 < <(bridge_bytes)
launch_bytes=$((rx1 - rx0 + tx1 - tx0))
for want in "rank 0 $(netns_id "$NS_A")" "rank 1 $(netns_id "$NS_B")"; do
  grep -qxF "$want" "$TMP/where.log" || die "expected '$want' (rank 0 in $NS_A, rank 1 in $NS_B):
$(cat "$TMP/where.log")"
done
[[ $(grep -c "^$IP_B " "$TMP/agent.log") -eq 1 ]] || die "the agent was not called once for $IP_B:
$(cat "$TMP/agent.log")"

# --- training: one process, then two ranks across the bridge ---
DATA=$TMP/text.txt
python3 -c 'import sys; sys.path.insert(0, sys.argv[1]); import textdata
textdata.write_pseudo_english(sys.argv[2])' "$SRC/tests" "$DATA"
TRAIN=(train "$CONFIG" --set "data.path=$DATA" --set "train.steps=$STEPS" --set train.seq_len=32)
PLAN=(--set 'plan.mesh={data=2}'
      --set 'plan.tactics=[{kind="fsdp",axis="data"},{kind="data",axis="data"}]')

bounded 120 "$TMP/single.log" "$LOOM" "${TRAIN[@]}" --run-dir "$TMP/single" ||
  die "the one-process run exited $?: $(tail -c 2000 "$TMP/single.log")"

read -r rx0 tx0 < <(bridge_bytes)
rc=0
bounded 300 "$TMP/two_host.log" \
  "${MPIRUN[@]}" "$LOOM" "${TRAIN[@]}" --run-dir "$TMP/two_host" "${PLAN[@]}" || rc=$?
((rc != 124)) || die "the two-host run timed out after 300 s: $(tail -c 3000 "$TMP/two_host.log")"
((rc == 0)) || die "the two-host run exited $rc: $(tail -c 3000 "$TMP/two_host.log")"
read -r rx1 tx1 < <(bridge_bytes)
a_to_b=$((rx1 - rx0))
b_to_a=$((tx1 - tx0))

# FSDP gathers and reduces the model (about 0.12M f32 parameters, 0.5 MB) every step: some 13 MB
# each way over 20 steps. Launching the ranks alone moves about 5 KB.
MIN_BYTES=$((1 << 20))
((a_to_b >= MIN_BYTES && b_to_a >= MIN_BYTES)) ||
  die "only $a_to_b bytes A->B and $b_to_a bytes B->A crossed the bridge (expected >= $MIN_BYTES" \
      "each way): the ranks did not talk over TCP between the namespaces"

compare() {  # compare RUN_DIR: its losses against the one-process run's; prints the worst
python3 - "$TMP/single/metrics.jsonl" "$1/metrics.jsonl" "$STEPS" <<'EOF'
import json, sys

def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f]

want, got, steps = load(sys.argv[1]), load(sys.argv[2]), int(sys.argv[3])
expected = list(range(1, steps + 1))
for name, rows in [("one-process", want), ("two-host", got)]:
    if [r["step"] for r in rows] != expected:
        sys.exit("%s run logged steps %s, expected 1..%d"
                 % (name, [r["step"] for r in rows], steps))
worst = 0.0
for a, b in zip(got, want):
    rel = abs(a["loss"] - b["loss"]) / abs(b["loss"])
    worst = max(worst, rel)
    if rel > 1e-5:
        sys.exit("step %d: loss %.9g on two hosts, %.9g in one process (relative difference %.3g)"
                 % (a["step"], a["loss"], b["loss"], rel))
    if (a.get("val_loss") is None) != (b.get("val_loss") is None):
        sys.exit("step %d: val_loss logged by only one run" % a["step"])
    va, vb = a.get("val_loss"), b.get("val_loss")
    if vb is not None and abs(va - vb) > 1e-5 * abs(vb):
        sys.exit("step %d: val_loss %.9g on two hosts, %.9g in one process"
                 % (a["step"], va, vb))
print("%.2g" % worst)
EOF
}
worst=$(compare "$TMP/two_host") || die "the two-host metrics do not match the one-process run"

echo "ok   two_host: fsdp over {data=2}, rank 0 in $NS_A, rank 1 in $NS_B: $STEPS steps," \
     "worst relative loss difference $worst; over bridge $BR: $a_to_b bytes A->B," \
     "$b_to_a bytes B->A (launch alone: $launch_bytes bytes both ways)"

# --- two ranks a host: megatron within each host, fsdp across (runtime/executor.h: each rank's
# host thread runs the model axis's collectives while its network thread runs the data axis's) ---
printf '%s slots=2\n%s slots=2\n' "$IP_A" "$IP_B" >"$TMP/hostfile4"
MPIRUN4=("${MPIRUN[@]}")
for i in "${!MPIRUN4[@]}"; do
  [[ ${MPIRUN4[i]} == 2 && ${MPIRUN4[i - 1]} == -np ]] && MPIRUN4[i]=4
  [[ ${MPIRUN4[i]} == "$TMP/hostfile" ]] && MPIRUN4[i]=$TMP/hostfile4
done
read -r rx0 tx0 < <(bridge_bytes)
rc=0
bounded ${FOUR_TIMEOUT:-300} "$TMP/four.log" \
  "${MPIRUN4[@]}" "$LOOM" "${TRAIN[@]}" --run-dir "$TMP/four" \
  --set 'plan.mesh={data=2,model=2}' \
  --set 'plan.tactics=[{kind="megatron",axis="model"},{kind="fsdp",axis="data"},{kind="data",axis="data"}]' ||
  rc=$?
((rc != 124)) || die "the four-rank run timed out after 300 s: $(tail -c 3000 "$TMP/four.log")"
((rc == 0)) || die "the four-rank run exited $rc: $(tail -c 3000 "$TMP/four.log")"
read -r rx1 tx1 < <(bridge_bytes)
((rx1 - rx0 >= MIN_BYTES && tx1 - tx0 >= MIN_BYTES)) ||
  die "the four-rank run moved only $((rx1 - rx0)) and $((tx1 - tx0)) bytes over the bridge"
worst4=$(compare "$TMP/four") || die "the four-rank metrics do not match the one-process run"
echo "ok   two_host: megatron over {model=2} within each host, fsdp over {data=2} across: $STEPS" \
     "steps, worst relative loss difference $worst4; over the bridge $((rx1 - rx0)) bytes A->B," \
     "$((tx1 - tx0)) bytes B->A"
