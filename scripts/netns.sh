# Shell helpers for "hosts" that are network namespaces of this machine, sourced by
# tests/two_host_test.sh and bench/overlap_bench.sh (which make the namespaces and links themselves).
#
#   netns_reachable NS_FROM NS_TO IP   a TCP round trip from NS_FROM to IP (in NS_TO), tried for up to
#                                      15 s: 0 when it answers. Run before MPI uses the link, so that
#                                      a link that drops traffic is reported as such, not as an MPI hang.
#   netns_agent FILE LOG IP_A NS_A IP_B NS_B
#                                      writes Open MPI's rsh agent to FILE: mpirun calls it as
#                                      `FILE HOST orted ARGS...` (ARGS quoted for a remote shell, as ssh
#                                      would run them) and it runs that line with sh -c in HOST's
#                                      namespace; each call's arguments are appended to LOG ("" for none).

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
    echo 'exec ip netns exec "$ns" /bin/sh -c "$*"'
  } >"$file"
  chmod +x "$file"
}
