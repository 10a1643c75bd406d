# Shell helpers for "hosts" that are network namespaces of this machine, sourced by
# tests/two_host_test.sh (which makes its namespaces and bridge itself), bench/overlap_bench.sh and
# bench/islands/slow_link.sh.
#
#   netns_pair NS_A NS_B NET [MTU]     makes namespaces NS_A and NS_B joined by a veth pair whose ends
#                                      are both named eth0, NET.1/24 in NS_A and NET.2/24 in NS_B, lo
#                                      and eth0 up (eth0's MTU set when given); non-zero, saying which
#                                      step failed, when one does.
#   netns_remove NS...                 kills what still runs in each namespace that exists and deletes
#                                      it (its end of a veth pair, and so the pair, with it).
#   netns_cleanup_on_exit DIR NS...   on the script's exit (an interrupt, a failure or a signal
#                                      included: INT, TERM, HUP exit 130, 143, 129) removes the
#                                      namespaces (netns_remove) and DIR, keeping the exit status.
#   netns_tbf NS RATE BURST LATENCY    tc's token bucket filter on NS's eth0 egress (RATE as tc says
#                                      it: 20mbit, 1gbit); RATE "unlimited" removes it.
#   netns_rate GBIT LATENCY NS...      netns_tbf on each NS at GBIT Gbit/s ("unlimited" removes it),
#                                      the bucket 1 ms of traffic and at least 64 KiB (a larger one
#                                      refills while compute runs and lets a short collective pass at
#                                      more than the rate, which flatters many small collectives).
#
#   netns_reachable NS_FROM NS_TO IP   a TCP round trip from NS_FROM to IP (in NS_TO), tried for up to
#                                      15 s: 0 when it answers. Run before MPI uses the link, so that
#                                      a link that drops traffic is reported as such, not as an MPI hang.
#   netns_agent FILE LOG IP_A NS_A IP_B NS_B
#                                      writes Open MPI's rsh agent to FILE: mpirun calls it as
#                                      `FILE HOST orted ARGS...` (ARGS quoted for a remote shell, as ssh
#                                      would run them) and it runs that line with sh -c in HOST's
#                                      namespace, under a host name of its own (the namespace's, in a
#                                      UTS namespace), so that MPI's processor names tell the hosts
#                                      apart as on real machines (comm/mpi.cc: spans_hosts); each
#                                      call's arguments are appended to LOG ("" for none).

netns_reachable() {
  local from=$1 to=$2 ip=$3 echo_pid ok=0 deadline
  ip netns exec "$to" timeout 20 python3 -c '
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 5999)); s.listen(1); s.settimeout(15)
c, _ = s.accept(); c.sendall(c.recv(16))' "$ip" 2>/dev/null &
  echo_pid=$!
  deadline=$((SECONDS + 15))
  while ((SECONDS < deadline)); do
    if ip netns exec "$from" timeout 5 python3 -c '
import socket, sys
c = socket.create_connection((sys.argv[1], 5999), timeout=3); c.sendall(b"ping")
sys.exit(c.recv(16) != b"ping")' "$ip" 2>/dev/null; then
      ok=1
      break
    fi
    sleep 0.1
  done
  wait "$echo_pid" || true
  ((ok))
}

netns_pair() {
  local a=$1 b=$2 net=$3 mtu=${4:-} ns
  ip netns add "$a" || { echo "netns: cannot create network namespace $a" >&2; return 1; }
  ip netns add "$b" || { echo "netns: cannot create network namespace $b" >&2; return 1; }
  # temporary names, unique per pair: interface names are at most 15 characters
  ip link add "v$a" netns "$a" type veth peer name "v$b" netns "$b" ||
    { echo "netns: cannot create a veth pair between $a and $b" >&2; return 1; }
  ip -n "$a" link set "v$a" name eth0
  ip -n "$b" link set "v$b" name eth0
  ip -n "$a" addr add "$net.1/24" dev eth0
  ip -n "$b" addr add "$net.2/24" dev eth0
  for ns in "$a" "$b"; do
    ip -n "$ns" link set lo up
    [[ -n $mtu ]] && ip -n "$ns" link set eth0 mtu "$mtu"
    ip -n "$ns" link set eth0 up
  done
}

netns_remove() {
  local ns pids
  for ns in "$@"; do
    [[ -e /run/netns/$ns ]] || continue
    mapfile -t pids < <(ip netns pids "$ns" 2>/dev/null)
    ((${#pids[@]})) && kill -KILL "${pids[@]}" 2>/dev/null
    ip netns del "$ns"
  done
  return 0
}

netns_cleanup_on_exit() {
  _netns_cleanup_dir=$1
  shift
  _netns_cleanup_ns=("$@")
  trap _netns_cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  trap 'exit 129' HUP
}

_netns_cleanup() {
  local rc=$?
  set +e
  trap - EXIT INT TERM HUP
  netns_remove "${_netns_cleanup_ns[@]}"
  rm -rf "$_netns_cleanup_dir"
  exit $rc
}

netns_tbf() {
  local ns=$1 rate=$2 burst=$3 latency=$4
  ip netns exec "$ns" tc qdisc del dev eth0 root 2>/dev/null || true
  [[ $rate == unlimited ]] && return 0
  ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$rate" burst "$burst" latency "$latency"
}

netns_rate() {
  local rate=$1 latency=$2 ns burst=0 spec=unlimited
  shift 2
  if [[ $rate != unlimited ]]; then
    burst=$(python3 -c "print(max(int(float('$rate') * 1e9 / 8 / 1000), 65536))")
    spec=${rate}gbit
  fi
  for ns in "$@"; do
    netns_tbf "$ns" "$spec" "$burst" "$latency" || return 1
  done
}

netns_agent() {
  local file=$1 log=$2 ip_a=$3 ns_a=$4 ip_b=$5 ns_b=$6
  {
    echo '#!/bin/sh'
    echo "# Open MPI's rsh agent: \$1 is the host, the rest the command line for its shell."
    [[ -n $log ]] && echo "echo \"\$*\" >>\"$log\""
    echo 'host=$1'
    echo 'shift'
    echo 'case $host in'
    echo "  $ip_a) ns=$ns_a ;;"
    echo "  $ip_b) ns=$ns_b ;;"
    echo "  *) echo \"netns agent: unknown host '\$host'\" >&2; exit 255 ;;"
    echo 'esac'
    echo 'exec ip netns exec "$ns" unshare --uts /bin/sh -c "hostname \"$ns\" && $*"'
  } >"$file"
  chmod +x "$file"
}
