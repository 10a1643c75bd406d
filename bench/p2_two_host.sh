#!/usr/bin/env bash
# P² for real: 4 ranks on two "hosts" (network namespaces joined by a veth pair, tc's tbf limiting
# the link on both ends), 2 ranks on each (TCP within a host over its own address, which the
# link's limit does not touch), every program bench/p2_run measures for a reduction over one axis spanning both hosts
# ({x = 4}) and over both axes of {a = 2, b = 2} (b within a host, a across), at each buffer size.
#
#   bench/p2_two_host.sh [RATE_GBIT] [SIZES] [REPS]     (root; default 1 "8e6 64e6" 5)
#
# Prints p2_run's JSON lines (one per program, then its summary), each with "link_gbit" added;
# checks that the reductions' bytes crossed the link. Everything made here is removed on exit.
# CASES="MESH:AXES ..." replaces the two cases (e.g. "a=2,b=2:a" for the all_reduce across the
# hosts alone, the hierarchical programs' middle step). CLUSTER=F plans on F (default
# clusters/two-hosts.toml); CALIBRATE_OUT=G first measures F's levels as the ranks here see them
# (`loom calibrate --level`, all 4 ranks): "shm" in both hosts at once (2 ranks each, TCP over the
# host's own address), then "tcp" over the 4 (--shared-by 2), into G, and plans on G.
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=$(pwd)
rate=${1:-1}
sizes=${2:-8e6 64e6}
reps=${3:-5}
run=$SRC/build/release/bench/p2_run
die() { echo "p2_two_host: $*" >&2; exit 1; }
[[ -x $run ]] || die "build first: cmake --build build/release --target p2_run"
[[ $(id -u) -eq 0 ]] || die "must run as root: it creates network namespaces"
for tool in ip tc mpirun python3 timeout; do
  command -v "$tool" >/dev/null || die "$tool not found on PATH"
done
# shellcheck source=../scripts/netns.sh
source "$SRC/scripts/netns.sh"

NET=10.213.79
NS_A=lp2A$$
NS_B=lp2B$$
TMP=$(mktemp -d /tmp/loom_p2.XXXXXX)
netns_cleanup_on_exit "$TMP" "$NS_A" "$NS_B"
netns_pair "$NS_A" "$NS_B" "$NET" 9000 || die "cannot join $NS_A and $NS_B"
netns_reachable "$NS_A" "$NS_B" "$NET.2" || die "namespace $NS_A cannot reach $NET.2"
netns_rate "$rate" 100ms "$NS_A" "$NS_B" || die "tc cannot limit the link to $rate Gbit/s"
AGENT=$TMP/agent
netns_agent "$AGENT" "" "$NET.1" "$NS_A" "$NET.2" "$NS_B"
printf '%s slots=2\n%s slots=2\n' "$NET.1" "$NET.2" >"$TMP/hostfile"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# TCP only: within a host over the namespace's own address (the kernel's loopback path, not the
# link), across hosts over the rate-limited veth. Open MPI's shared memory (vader) is refused: both
# namespaces have one hostname, so it would join ranks across "hosts" (and it crashed there in
# MPI_Comm_dup when tried)
# shellcheck disable=SC2054
mpi=(ip netns exec "$NS_A" mpirun --allow-run-as-root --bind-to none -np 4
     --hostfile "$TMP/hostfile" --mca plm_rsh_agent "$AGENT"
     --mca pml ob1 --mca btl tcp,self
     --mca btl_tcp_if_include "$NET.0/24" --mca oob_tcp_if_include "$NET.0/24"
     -x OMP_NUM_THREADS -x OMP_WAIT_POLICY -x PATH
     -x OMPI_ALLOW_RUN_AS_ROOT -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM)
tx() { ip netns exec "$NS_A" cat /sys/class/net/eth0/statistics/tx_bytes; }
cluster=${CLUSTER:-$SRC/clusters/two-hosts.toml}
if [[ -n ${CALIBRATE_OUT:-} ]]; then
  "$SRC/build/release/tools/loom/loom" calibrate --level shm --launcher "${mpi[*]}" \
    --base "$cluster" --out "$TMP/shm.toml" >&2 || die "loom calibrate --level shm failed"
  "$SRC/build/release/tools/loom/loom" calibrate --level tcp --shared-by 2 --launcher "${mpi[*]}" \
    --base "$TMP/shm.toml" --out "$CALIBRATE_OUT" >&2 || die "loom calibrate --level tcp failed"
  cluster=$CALIBRATE_OUT
fi
for bytes in $sizes; do
  for c in ${CASES:-x=4:x a=2,b=2:a,b}; do
    mesh=${c%%:*} axes=${c#*:}
    before=$(tx)
    timeout 900 "${mpi[@]}" "$run" "$cluster" "$mesh" "$axes" "$bytes" \
      "$reps" >"$TMP/out" 2>"$TMP/err" || die "p2_run $mesh $axes $bytes: $(tail -c 2000 "$TMP/err")"
    sent=$(($(tx) - before))
    python3 - "$TMP/out" "$rate" "$sent" "$bytes" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
if int(sys.argv[3]) < float(sys.argv[4]) / 4:
    sys.exit(f"only {sys.argv[3]} bytes left host A: the ranks did not use the link")
for r in rows:
    r["link_gbit"] = float(sys.argv[2])
    print(json.dumps(r))
PY
  done
done
