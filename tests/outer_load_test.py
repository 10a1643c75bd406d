#!/usr/bin/env python3
"""loom outer-server under load: 16 islands of the tiny model in sync mode (H = 2, 100 steps each, so
50 rounds) against one server. Every island exits 0 with all its steps, no round is lost (the final
version is 50, at every island and at the server), no island is dropped, and the server's memory
stays flat: the lower quartile of the VmRSS sampled (every 0.2 s) over the last third of the run
(rounds >= 33) is within 10% (or 8 MiB, whichever is larger) of that over rounds 5..15. A quartile, not
the largest sample: one sample swings by 10+ MiB with the pushes in flight when it is read, while a
leak raises every sample: one of 0.5 MiB a round (a third of one push's tensors) is +12 MiB between
the two windows.

The server is told to expect 16 islands ([outer] islands), so its first round waits for all of them
(the start barrier): an island starting late still takes part in every round.

    outer_load_test.py LOOM_BINARY SOURCE_DIR
"""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

from textdata import write_pseudo_english

LOOM, SRC = sys.argv[1], sys.argv[2]
CONFIG = os.path.join(SRC, "configs", "tiny-llama.toml")
N, H, STEPS = 16, 2, 100
ROUNDS = STEPS // H
LATE = ROUNDS * 2 // 3  # the last third of the rounds: the window compared with rounds 5..15
failures = 0


def check(ok, what):
    global failures
    print("%-4s %s" % ("ok" if ok else "FAIL", what), flush=True)
    failures += 0 if ok else 1
    return ok


def read(path):
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def rss_kib(pid):
    for line in read("/proc/%d/status" % pid).splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return None


def metrics(run):
    out = []
    for line in read(os.path.join(run, "metrics.jsonl")).splitlines(keepends=True):
        if not line.endswith("\n"):
            break
        out.append(json.loads(line))
    return out


procs, logs = [], []
# a SIGTERM (a harness timing the test out) still goes through the finally block that ends the processes
signal.signal(signal.SIGTERM, lambda *_: sys.exit("outer load: terminated"))
with tempfile.TemporaryDirectory() as d:
    data = os.path.join(d, "text.txt")
    write_pseudo_english(data)
    env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="passive",
               LOOM_OUTER_TOKEN="outer-load-test-token")
    # a generous lease: 17 processes share the cores, and a dropped island would lose its round
    common = ["--set", "data.path=" + data, "--set", "train.steps=%d" % STEPS,
              "--set", "outer.inner_steps=%d" % H, "--set", "outer.mode=sync",
              "--set", "outer.lease_s=30", "--set", "outer.retry_s=60",
              "--set", "outer.islands=%d" % N]

    def start(args, log):
        f = open(log, "wb")
        logs.append(f)
        p = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT, env=env)
        procs.append(p)
        return p

    try:
        srv_log, pf = os.path.join(d, "server.log"), os.path.join(d, "port")
        srv = start([LOOM, "outer-server", CONFIG, "--listen", "127.0.0.1:0", "--state-dir",
                     os.path.join(d, "state"), "--port-file", pf] + common, srv_log)
        port, deadline = None, time.time() + 30
        while port is None and time.time() < deadline and srv.poll() is None:
            try:
                port = int(read(pf).strip())
            except ValueError:
                time.sleep(0.02)
        if not check(port is not None, "the server listens%s" % (
                "" if port else " (rc %s): %s" % (srv.poll(), read(srv_log)[-400:]))):
            sys.exit(1)
        runs = [os.path.join(d, "island%02d" % i) for i in range(N)]
        t0 = time.time()
        # --slowdown 5: rounds of ~0.25 s rather than ~0.1 s, so that ~10 samples fall in rounds 5..15
        isl = [start([LOOM, "train", CONFIG, "--run-dir", r, "--set", "outer.server=127.0.0.1:%d" % port,
                      "--slowdown", "5"] + common, r + ".log") for r in runs]
        samples = []  # (seconds, last round closed, VmRSS KiB)
        deadline = time.time() + 720
        while time.time() < deadline and srv.poll() is None:
            rounds = [int(r) for r in re.findall(r"round (\d+) closed", read(srv_log))]
            kib = rss_kib(srv.pid)
            if kib is not None:
                samples.append((time.time() - t0, max(rounds, default=0), kib))
            if all(p.poll() is not None for p in isl):
                break
            time.sleep(0.2)
        wall = time.time() - t0
        rcs = [p.poll() for p in isl]
        check(all(rc == 0 for rc in rcs), "%d islands exit 0 in %.1f s: %s" % (N, wall, rcs))
        for r, rc in zip(runs, rcs):
            if rc != 0:
                print("     %s: %s" % (os.path.basename(r), read(r + ".log")[-600:]))
        bad = []
        for r in runs:
            m = metrics(r)
            v = [j["outer_version"] for j in m if "outer_version" in j]
            if [j["step"] for j in m] != list(range(1, STEPS + 1)) or not v or v[-1] != ROUNDS:
                bad.append((os.path.basename(r), len(m), v[-1] if v else None))
        check(not bad, "every island logs steps 1..%d and ends at version %d%s"
              % (STEPS, ROUNDS, "" if not bad else ": not %s (name, steps, version)" % bad))
        slog = read(srv_log)
        closed = [(int(r), int(n)) for r, n in re.findall(r"round (\d+) closed: (\d+) island", slog)]
        # an island whose join comes after round 1 has pushes is expected from round 2 on (its first
        # push may then be stale); from round 2 on every round has all N
        partial = [(r, n) for r, n in closed if n != N]
        check([r for r, _ in closed] == list(range(1, ROUNDS + 1)) and all(r == 1 for r, _ in partial),
              "the server closes rounds 1..%d, each with all %d pushes from round 2 on "
              "(rounds with fewer: %s)" % (ROUNDS, N, partial or "none"))
        check("dropped" not in slog, "no island is dropped")

        # Memory: each push in flight holds ~1-2 MiB (its message and the tensors it is assembled
        # into), so VmRSS swings by 10+ MiB with the number of pushes under way when it is sampled:
        # the largest sample of a window says more about that than about a leak (it once failed a
        # clean server by +8.6 MiB). A window's lower quartile is the server between pushes, which
        # a leak raises with every round.
        early = [s for s in samples if 5 <= s[1] <= 15]
        late = [s for s in samples if s[1] >= LATE]
        if check(len(early) >= 5 and len(late) >= 5, "%d VmRSS samples, %d over rounds 5..15, %d from round %d on"
                 % (len(samples), len(early), len(late), LATE)):
            def quantile(window, q):
                xs = sorted(x[2] for x in window)
                return xs[int(q * (len(xs) - 1))]
            base, tail = quantile(early, 0.25), quantile(late, 0.25)
            allow = max(0.10 * base, 8 * 1024)
            print("     server VmRSS (MiB, lower quartile / median / max): rounds 5..15 %.1f / %.1f / %.1f; "
                  "rounds >= %d %.1f / %.1f / %.1f; final %.1f (islands done)"
                  % tuple([x / 1024 for x in (base, quantile(early, 0.5), quantile(early, 1))] + [LATE] +
                          [x / 1024 for x in (tail, quantile(late, 0.5), quantile(late, 1), samples[-1][2])]))
            check(tail - base <= allow,
                  "server RSS flat: the lower quartile over rounds >= %d is %+.1f MiB from that over rounds "
                  "5..15 (allowed +%.1f MiB)" % (LATE, (tail - base) / 1024, allow / 1024))
        srv.send_signal(signal.SIGTERM)
        try:
            rc = srv.wait(30)
        except subprocess.TimeoutExpired:
            rc = None
        m = re.search(r"stopped at version (\d+)", read(srv_log))
        check(rc == 0 and m is not None and int(m.group(1)) == ROUNDS,
              "the server stops on SIGTERM (rc %s) at version %s" % (rc, m and m.group(1)))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        for f in logs:
            f.close()
print("outer load: all passed" if not failures else "outer load: %d FAILED" % failures)
sys.exit(1 if failures else 0)
