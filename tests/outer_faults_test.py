#!/usr/bin/env python3
"""Faults of the outer sync service (loom outer-server and loom train islands), end to end.

1. An island SIGKILLed mid-run (after its first outer round): the server drops it when its lease
   expires, rounds keep closing, and the two survivors train to their last step and exit 0 at the
   final version steps/H.
2. An island joining mid-run (the server at version >= 2) joins at that version, completes its first
   outer round, takes part in the rounds from then on, and finishes with exit 0.
3. The server SIGKILLed mid-run, while it holds one island's push of the open round and not the
   other's, and restarted on the same port with the same --state-dir: it resumes from its state, the
   islands reconnect, the lost push is sent again (RESEND), and both finish with exit 0; no completed
   round is lost (the final version is steps/H, the resumed version at least what islands had seen).
4. One island with outer lr 1 and momentum 0 (global = local after every round) logs the same loss
   at every step as a plain loom train of the same config (1e-5 relative).
3b. An island SIGKILLed and restarted on its run dir (--resume auto) rejoins under its own id, and the
   round under way stops waiting for the old process at once (the lease is longer than the test).
3c. Async: the same; every push the server took is a version (the server's version at the end is
   its pushes).
3d. Async: the server SIGKILLed mid-run and restarted on its port and state dir resumes at a version
   at least what the islands had seen; both islands finish; the final version is the resumed one
   plus the pushes the restarted server took.
4b. An island that is 2 ranks of an fsdp plan (rank 0 talks to the server and broadcasts) logs the
   losses of a one-process island on the same settings (outer lr 0.5, momentum 0.5), which are not
   those of plain training.
6. Streaming DiLoCo (fragments = 2): one island with outer lr 1 and momentum 0 logs plain training's
   losses (no overlap; overlap 2 with mix 1); with overlap, mix and int4 pushes an island killed is
   dropped and one joining late falls in with the fragments' cycle; the server killed and restarted
   loses no round.
9. DiPaCo (modules [1, 2]: two paths sharing level 0): one island on a path with outer lr 1 and
   momentum 0 logs plain training's losses; of three islands (paths 0, 1, 1) one SIGKILLed is dropped
   while the others go on, and one joining late on path 0 trains to its end; the server SIGKILLed
   and restarted resumes every member's path and loses no round; an island of other modules is
   refused.
5. Bad configuration: a wrong token (the island exits non-zero, quickly, saying "token"), a server
   without a token (exit 1 naming LOOM_OUTER_TOKEN), an island whose model differs (exit non-zero
   naming a tensor), a server that cannot write its state (exit 1, nothing left behind).

Every process is started with OMP_NUM_THREADS=1 and passive OpenMP waits (many share the cores), every
wait has a deadline, and every process is killed and reaped before its scenario ends.

    outer_faults_test.py LOOM_BINARY SOURCE_DIR [ONLY]   (ONLY: the scenarios whose name starts so)
"""
import json
import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import time
import traceback

from textdata import write_pseudo_english

LOOM, SRC = sys.argv[1], sys.argv[2]
ONLY = sys.argv[3] if len(sys.argv) > 3 else ""
CONFIG = os.path.join(SRC, "configs", "tiny-llama.toml")
TOKEN = "outer-faults-test-token"
H, STEPS, LEASE = 5, 60, 1.5
SLOW = "20"  # --slowdown of the islands: ~60 ms a step, so a run of 60 steps lasts a few seconds
failures = 0
procs = []  # the processes of the scenario under way


def check(ok, what):
    global failures
    print("%-4s %s" % ("ok" if ok else "FAIL", what), flush=True)
    failures += 0 if ok else 1
    return ok


def one_line(text, n=300):
    return " | ".join(text.strip().splitlines())[-n:]


def env(token=TOKEN):
    e = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="passive")
    e.pop("LOOM_OUTER_TOKEN", None)
    if token is not None:
        e["LOOM_OUTER_TOKEN"] = token
    return e


def sets(**kv):
    out = []
    for k, v in kv.items():
        out += ["--set", "%s=%s" % (k.replace("__", "."), v)]
    return out


class Proc:
    """A loom process with stdout and stderr in one log file."""

    def __init__(self, args, log, token=TOKEN, run=None):
        self.log, self.run, self.args = log, run, args
        self.f = open(log, "wb")
        self.p = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=self.f,
                                  stderr=subprocess.STDOUT, env=env(token))
        self.pid = self.p.pid
        procs.append(self)

    def alive(self):
        return self.p.poll() is None

    def wait(self, timeout):
        """The exit status, or None (the process is killed) if it did not end in `timeout` s."""
        try:
            return self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def kill(self, sig=signal.SIGKILL):
        if self.p.poll() is None:
            self.p.send_signal(sig)
        try:
            self.p.wait(10)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()

    def text(self):
        with open(self.log, "rb") as f:
            return f.read().decode("utf-8", "replace")


def reap_all():
    while procs:
        pr = procs.pop()
        pr.kill()
        pr.f.close()


def start_server(d, name, common, state, listen="127.0.0.1:0", token=TOKEN):
    """(server, port); port is None (and the server killed) if it does not come up in 30 s."""
    pf = os.path.join(d, name + ".port")
    srv = Proc([LOOM, "outer-server", CONFIG, "--listen", listen, "--state-dir", state,
                "--port-file", pf] + common, os.path.join(d, name + ".log"), token=token)
    deadline = time.time() + 30
    while time.time() < deadline and srv.alive():
        try:
            with open(pf) as f:
                return srv, int(f.read().strip())
        except (OSError, ValueError):
            time.sleep(0.02)
    check(False, "%s did not come up (rc %s): %s" % (name, srv.p.poll(), srv.text()[-600:]))
    srv.kill()
    return srv, None


def start_island(d, name, port, common, slowdown=SLOW, extra=(), token=TOKEN):
    run = os.path.join(d, name)
    args = [LOOM, "train", CONFIG, "--run-dir", run, "--set", "outer.server=127.0.0.1:%d" % port]
    if slowdown:
        args += ["--slowdown", slowdown]
    return Proc(args + common + list(extra), os.path.join(d, name + ".log"), token=token, run=run)


def metrics(run):
    """The complete lines of RUN/metrics.jsonl (one being written is left out)."""
    out = []
    try:
        with open(os.path.join(run, "metrics.jsonl")) as f:
            for line in f:
                if not line.endswith("\n"):
                    break
                out.append(json.loads(line))
    except OSError:
        pass
    return out


def server_line(log, proc, what):
    """The server's line about PROC's island (its name holds the pid): `island ID (...) WHAT`;
    group 1 is the island's id."""
    return re.search(r"island (\d+) \(\S+:%d [^)]*\) %s" % (proc.pid, what), log)


def last_version(run):
    v = [j["outer_version"] for j in metrics(run) if "outer_version" in j]
    return v[-1] if v else None


def wait_for(pred, timeout, alive):
    """Polls pred() until it is true, every process in `alive` still runs, and `timeout` s pass."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return True
        if not all(p.alive() for p in alive):
            return pred()
        time.sleep(0.02)
    return False


def check_finished(isl, rc, what, want=STEPS // H):
    """The island exited 0 with every step logged and a last sync at version `want`."""
    m = metrics(isl.run)
    steps = [j["step"] for j in m]
    check(rc == 0, "%s exits 0 (rc %s)%s" % (what, rc, "" if rc == 0 else ": " + isl.text()[-800:]))
    check(steps == list(range(1, STEPS + 1)), "%s logs steps 1..%d (%d lines, last %s)"
          % (what, STEPS, len(steps), steps[-1] if steps else None))
    v = last_version(isl.run)
    check(v == want, "%s ends at outer version %s (want %d)" % (what, v, want))


def stop_server(srv):
    """SIGTERM; the version of its `stopped at version V` line, or None."""
    srv.p.send_signal(signal.SIGTERM)
    rc = srv.wait(30)
    m = re.search(r"stopped at version (\d+)", srv.text())
    check(rc == 0 and m is not None, "%s stops on SIGTERM (rc %s)" % (os.path.basename(srv.log), rc))
    return int(m.group(1)) if m else None


def common_sets(data, **more):
    kv = dict(data__path=data, train__steps=STEPS, outer__inner_steps=H, outer__lease_s=LEASE,
              outer__mode="sync", outer__retry_s=30)
    kv.update(more)
    return sets(**kv)


# ---- the scenarios ----

def kill_one_of_three(d, common, extras=((), (), ())):
    """A server and 3 islands on `common` (island i with extras[i] besides); island 2 SIGKILLed once
    it has completed an outer round. (server, port, islands, victim), or None when that did not
    happen."""
    srv, port = start_server(d, "server", common, os.path.join(d, "state"))
    if port is None:
        return None
    isl = [start_island(d, "island%d" % i, port, common, extra=extras[i]) for i in range(3)]
    victim = isl[2]
    ok = wait_for(lambda: any("outer_round" in j for j in metrics(victim.run)), 60, isl)
    if not check(ok, "the victim completes an outer round (rc %s)" % victim.p.poll()):
        return None
    victim.kill()
    return srv, port, isl, victim


def island_killed(d, data):
    common = common_sets(data)
    started = kill_one_of_three(d, common)
    if started is None:
        return
    srv, _, isl, victim = started
    killed_at = metrics(victim.run)
    check(victim.p.returncode == -signal.SIGKILL and killed_at[-1]["step"] < STEPS,
          "victim (pid %d) SIGKILLed mid-run, after step %d, version %s"
          % (victim.pid, killed_at[-1]["step"], last_version(victim.run)))
    for i, s in enumerate(isl[:2]):
        check_finished(s, s.wait(120), "survivor %d" % i)
    log = srv.text()
    drop = server_line(log, victim, "dropped: lease expired")
    check(drop is not None, "the server drops the victim by lease expiry")
    if drop:
        later = [int(r) for r in re.findall(r"round (\d+) closed", log[drop.end():])]
        check(later and max(later) == STEPS // H,
              "rounds keep closing after the drop: %s" % later)
    check(stop_server(srv) == STEPS // H, "the server stops at version %d" % (STEPS // H))


def island_joins(d, data):
    common = common_sets(data)
    srv, port = start_server(d, "server", common, os.path.join(d, "state"))
    if port is None:
        return
    isl = [start_island(d, "island%d" % i, port, common) for i in range(2)]
    ok = wait_for(lambda: (last_version(isl[0].run) or 0) >= 2, 60, isl)
    if not check(ok, "the first two islands reach version 2"):
        return
    late = start_island(d, "late", port, common)
    rcs = [s.wait(120) for s in isl + [late]]
    for i, s in enumerate(isl):
        check(rcs[i] == 0, "island %d exits 0 (rc %s)" % (i, rcs[i]))
    text = late.text()
    j = re.search(r"island (\d+): joined 127\.0\.0\.1:%d at version (\d+)" % port, text)
    v = int(j.group(2)) if j else -1
    check(j is not None and v >= 2, "the late island joins at version %d (>= 2)" % v)
    check(rcs[2] == 0, "the late island exits 0 (rc %s)%s" % (rcs[2], "" if rcs[2] == 0 else ": " + text[-800:]))
    m = metrics(late.run)
    steps = [x["step"] for x in m]
    check(steps == list(range(1, STEPS + 1)), "the late island logs steps 1..%d" % STEPS)
    first = next((x for x in m if "outer_round" in x), None)
    check(first is not None and first["step"] == H and first["outer_round"] == 1
          and first["outer_version"] > v,
          "its first outer round completes at step %d: %s" % (H, first and {
              k: first[k] for k in ("step", "outer_round", "outer_version")}))
    check("dropped by the server" not in text and "rejected" not in text,
          "the late island is never dropped nor refused")
    if "stale push" in text:
        print("     (its first push came after that round had closed: %s)"
              % re.search(r"stale push[^\n]*", text).group(0))
    log = srv.text()
    jl = re.search(r"island %s \(\S+:%d [^)]*\) joined at version %d" % (j.group(1) if j else "-",
                                                                          late.pid, v), log)
    three = re.findall(r"round (\d+) closed: 3 island\(s\) pushed", log[jl.end():] if jl else "")
    check(jl is not None and len(three) > 0,
          "the server logs its join and rounds with 3 pushes after it: %s" % three)
    stop_server(srv)


def restart_one_of_two(d, common):
    """A server and 2 islands on `common`; island 1 SIGKILLed after two outer rounds and restarted
    on its run dir (--resume auto); both awaited. (server, islands [0, restarted]), or None when
    that did not happen; checks that both exit 0 and that the restarted one rejoins under its id."""
    srv, port = start_server(d, "server", common, os.path.join(d, "state"))
    if port is None:
        return None
    isl = [start_island(d, "island%d" % i, port, common) for i in range(2)]
    victim = isl[1]
    ok = wait_for(lambda: any(j.get("outer_round", 0) >= 2 for j in metrics(victim.run)), 60, isl)
    if not check(ok, "the victim completes two outer rounds (rc %s)" % victim.p.poll()):
        return None
    victim.kill()
    first = server_line(srv.text(), victim, "joined")
    if not check(first is not None, "the server logged the victim's join"):
        return None
    again = start_island(d, "island1", port, common, extra=["--resume", "auto"])
    rcs = [isl[0].wait(50), again.wait(50)]
    check(rcs == [0, 0], "the other island and the restarted one exit 0 (rcs %s)%s" % (
        rcs, "" if rcs == [0, 0] else ": " + again.text()[-600:]))
    log = srv.text()
    re_id = server_line(log, again, "rejoined")
    check(re_id is not None and re_id.group(1) == first.group(1),
          "it rejoins as island %s (the server says: %s)" % (
              first.group(1), re_id.group(0) if re_id else one_line(log[-300:])))
    return srv, [isl[0], again]


def island_restarted(d, data):
    # Issue 16's stable identity: an island SIGKILLed and restarted on its run dir (--resume auto)
    # rejoins under its own id (so its data stream), and the round under way stops waiting for the
    # dead process at once: the lease is 60 s, longer than the whole scenario is allowed.
    common = common_sets(data, outer__lease_s=60, checkpoint__every=H)
    t0 = time.time()
    started = restart_one_of_two(d, common)
    if started is None:
        return
    srv, (other, again) = started
    log = srv.text()
    check("dropped: lease expired" not in log, "no island was dropped by its lease")
    check(time.time() - t0 < 60, "done in %.0f s, within one lease" % (time.time() - t0))
    steps = [j["step"] for j in metrics(again.run)]
    check(steps == list(range(1, STEPS + 1)), "the restarted island logs steps 1..%d" % STEPS)
    # rounds close to the end (the round the restart fell in closed without it; the restarted island
    # redoes the steps since its checkpoint, so it may close a last round alone after the other left)
    final, seen = stop_server(srv), [last_version(r.run) for r in (other, again)]
    check(final is not None and None not in seen and final == max(seen) and
          min(seen) >= STEPS // H - 1,
          "the server stops at version %s, the last an island saw (%s)" % (final, seen))


def server_restarted(d, data):
    # With LEASE = 1.5 s the islands must get through to the restarted server well within a lease
    # (an island whose lease ran out is dropped and rejoins, throwing its round away by design).
    common = common_sets(data)
    state = os.path.join(d, "state")
    srv, port = start_server(d, "server", common, state)
    if port is None:
        return
    # a fast island and a slow one: each round the fast one pushes, then waits for the slow one
    fast = start_island(d, "fast", port, common, slowdown="5")
    slow = start_island(d, "slow", port, common, slowdown="25")
    isl = [fast, slow]
    ok = wait_for(lambda: (last_version(slow.run) or 0) >= 2, 60, isl + [srv])
    if not check(ok, "the islands reach version 2"):
        return
    # Kill the server while it holds the fast island's push of the open round and not the slow
    # one's: the server logged the fast island's push to round R (its evidence, not a guess from
    # the island's silence), not the slow one's nor R's close, and the slow island is at least two
    # steps from its push (it pushes after step R*H).
    def ids(log):
        return {p.pid: m.group(1) for p in isl for m in [server_line(log, p, "joined")] if m}

    def fast_waits():
        log, s = srv.text(), metrics(slow.run)
        who = ids(log)
        if len(who) != 2 or not s:
            return False
        pushes = re.findall(r"island %s \([^)]*\) pushed to round (\d+)\n" % who[fast.pid], log)
        if not pushes:
            return False
        r = int(pushes[-1])
        return (r < STEPS // H and "round %d closed" % r not in log
                and not re.search(r"island %s \([^)]*\) pushed to round %d\n" % (who[slow.pid], r), log)
                and s[-1]["step"] <= r * H - 2)

    ok = wait_for(fast_waits, 60, isl + [srv])
    if not check(ok, "the fast island waits in a round the slow one has not pushed to"):
        return
    srv.kill()
    seen_v = max(last_version(s.run) or 0 for s in isl)
    check(srv.p.returncode == -signal.SIGKILL,
          "server SIGKILLed: fast island after step %d, slow after step %d, version %d seen"
          % (metrics(fast.run)[-1]["step"], metrics(slow.run)[-1]["step"], seen_v))
    time.sleep(0.3)  # the islands find it gone
    srv2, port2 = start_server(d, "server2", common, state, listen="127.0.0.1:%d" % port)
    if port2 is None:
        return
    check(port2 == port, "restarted on the same port %d (%s)" % (port, port2))
    m = re.search(r"resumed from \S+: version (\d+)", srv2.text())
    check(m is not None and int(m.group(1)) >= seen_v,
          "the restarted server resumes from its state at version %s (islands had seen %d)"
          % (m and m.group(1), seen_v))
    check_finished(fast, fast.wait(120), "fast island")
    check_finished(slow, slow.wait(120), "slow island")
    check("pushing again" in fast.text() and "dropped by the server" not in fast.text(),
          "the fast island pushes its lost push again: %s" % (
              re.findall(r"island \d+: [^\n]*(?:again|stale)[^\n]*", fast.text()) or "no such line"))
    for s in isl:
        w = [j["wait_s"] for j in metrics(s.run) if "wait_s" in j]
        print("     %s island: %.1f s waiting for the server in all" % (os.path.basename(s.run),
                                                                        w[-1] if w else -1))
    check(stop_server(srv2) == STEPS // H, "the server stops at version %d" % (STEPS // H))


def stopped_line(srv):
    """SIGTERM; (version, pushes accepted since that process started) of its last line."""
    srv.p.send_signal(signal.SIGTERM)
    rc = srv.wait(30)
    m = re.search(r"stopped at version (\d+) \((\d+) pushes\)", srv.text())
    check(rc == 0 and m is not None, "%s stops on SIGTERM (rc %s)" % (os.path.basename(srv.log), rc))
    return (int(m.group(1)), int(m.group(2))) if m else (None, None)


def async_island_restarted(d, data):
    # Async: an island SIGKILLed and restarted on its run dir (--resume auto) rejoins under its id;
    # the other never waits for it, and every push the server took is a version (none lost).
    common = common_sets(data, outer__mode="async", outer__lease_s=60, checkpoint__every=H)
    started = restart_one_of_two(d, common)
    if started is None:
        return
    srv, isl = started
    for s in isl:
        steps = [j["step"] for j in metrics(s.run)]
        check(steps == list(range(1, STEPS + 1)), "%s logs steps 1..%d" % (
            os.path.basename(s.run), STEPS))
    seen = [last_version(r.run) for r in isl]
    version, pushes = stopped_line(srv)
    check(version is not None and version == pushes and None not in seen and version >= max(seen),
          "the server stops at version %s = the %s pushes it took (islands saw %s)"
          % (version, pushes, seen))


def async_server_restarted(d, data):
    # Async: the server SIGKILLed mid-run and restarted on its port and state dir resumes at a
    # version at least every island had seen (the state is written before a version is seen); the
    # islands reconnect (a push under way is sent again) and finish; every push the restarted server
    # took is a version past the resumed one.
    common = common_sets(data, outer__mode="async")
    state = os.path.join(d, "state")
    srv, port = start_server(d, "server", common, state)
    if port is None:
        return
    isl = [start_island(d, "fast", port, common, slowdown="5"),
           start_island(d, "slow", port, common, slowdown="25")]
    # the server's version, as the fast island last saw it: in async the fast island never waits
    # for the slow one, so under load it may finish before the slow one has pushed three times
    ok = wait_for(lambda: max(last_version(s.run) or 0 for s in isl) >= 3, 60, isl + [srv])
    if not check(ok, "the islands reach version 3 (rcs %s)" % [p.p.poll() for p in isl + [srv]]):
        return
    srv.kill()
    seen_v = max(last_version(s.run) or 0 for s in isl)
    time.sleep(0.3)
    srv2, port2 = start_server(d, "server2", common, state, listen="127.0.0.1:%d" % port)
    if port2 is None:
        return
    m = re.search(r"resumed from \S+: version (\d+)", srv2.text())
    resumed = int(m.group(1)) if m else -1
    check(resumed >= seen_v, "the restarted server resumes at version %d (islands had seen %d)"
          % (resumed, seen_v))
    for s in isl:
        rc = s.wait(120)
        steps = [j["step"] for j in metrics(s.run)]
        check(rc == 0 and steps == list(range(1, STEPS + 1)),
              "%s island exits 0 (rc %s) having logged steps 1..%d%s" % (
                  os.path.basename(s.run), rc, STEPS, "" if rc == 0 else ": " + s.text()[-600:]))
        check("dropped by the server" not in s.text(), "%s island is never dropped" %
              os.path.basename(s.run))
    version, pushes = stopped_line(srv2)
    check(version is not None and version == resumed + pushes,
          "the server stops at version %s = %d resumed + %s pushes taken" % (version, resumed,
                                                                             pushes))


def single_island_parity(d, data):
    common = common_sets(data, train__steps=30, outer__lr=1.0, outer__momentum=0.0)
    plain = os.path.join(d, "plain")
    p = Proc([LOOM, "train", CONFIG, "--run-dir", plain] + common, os.path.join(d, "plain.log"))
    rc = p.wait(120)
    if not check(rc == 0, "plain loom train exits 0 (rc %s)" % rc):
        return
    srv, port = start_server(d, "server", common, os.path.join(d, "state"))
    if port is None:
        return
    isl = start_island(d, "island", port, common, slowdown=None)
    rc = isl.wait(120)
    check(rc == 0 and re.search(r"island 1: joined", isl.text()) is not None,
          "the island (id 1, data rank 0) exits 0 (rc %s)" % rc)
    a, b = metrics(plain), metrics(isl.run)
    check(len(a) == 30 and len(b) == 30, "both log 30 steps (%d, %d)" % (len(a), len(b)))
    worst, at = 0.0, None
    for x, y in zip(a, b):
        rel = abs(x["loss"] - y["loss"]) / abs(x["loss"])
        if rel > worst:
            worst, at = rel, x["step"]
    check(worst <= 1e-5 and len(a) == len(b),
          "per-step losses agree: worst relative difference %.2g (step %s); last %.5f vs %.5f"
          % (worst, at, a[-1]["loss"] if a else float("nan"), b[-1]["loss"] if b else float("nan")))
    check(last_version(isl.run) == 6, "6 outer rounds (version %s)" % last_version(isl.run))
    stop_server(srv)


def plan_island_parity(d, data):
    # Issue 16's islands made of plans: an island that is 2 ranks of an fsdp plan (threads of one
    # process; rank 0 talks to the server and broadcasts) logs the losses of a one-process island
    # on the same settings, and an outer step that changes the parameters (lr 0.5, momentum 0.5)
    # makes both differ from plain training of that plan.
    plan = ["--set", "plan.mesh={ data = 2 }", "--set", 'plan.tactics=[{ kind = "fsdp", axis = "data" }]',
            "--set", "plan.ranks=local"]
    common = common_sets(data, train__steps=30, outer__lr=0.5, outer__momentum=0.5)
    runs = {}
    for name, extra in (("one", []), ("plan", plan)):
        srv, port = start_server(d, "server_" + name, common, os.path.join(d, "state_" + name))
        if port is None:
            return
        isl = start_island(d, "island_" + name, port, common + extra, slowdown=None)
        rc = isl.wait(120)
        check(rc == 0 and re.search(r"island 1: joined", isl.text()) is not None,
              "the %s island exits 0, joined once (rc %s)%s" % (
                  name, rc, "" if rc == 0 else ": " + isl.text()[-400:]))
        check(last_version(isl.run) == 6, "%s: 6 outer rounds (version %s)" % (
            name, last_version(isl.run)))
        stop_server(srv)
        runs[name] = metrics(isl.run)
    plain = os.path.join(d, "plain")
    p = Proc([LOOM, "train", CONFIG, "--run-dir", plain] + common + plan, os.path.join(d, "plain.log"))
    rc = p.wait(120)
    check(rc == 0, "plain loom train on 2 local ranks exits 0 (rc %s)" % rc)
    a, b, c = runs["one"], runs["plan"], metrics(plain)
    check(len(a) == len(b) == len(c) == 30, "30 steps each (%d, %d, %d)" % (len(a), len(b), len(c)))
    rel = lambda x, y: abs(x["loss"] - y["loss"]) / abs(x["loss"])
    worst = max((rel(x, y) for x, y in zip(a, b)), default=1)
    check(worst <= 1e-4, "the plan island's losses are the one-process island's: worst relative "
          "difference %.2g" % worst)
    apart = max((rel(x, y) for x, y in zip(b, c)), default=0)
    check(apart > 1e-3, "and not plain training's (the outer steps moved it: up to %.2g apart)" % apart)


# ---- streaming DiLoCo (fragments) ----

# Two fragments of H = 10: one is pushed every 5 steps, and the last step pushes the other too, so
# STEPS steps end at version STEPS / 5 + 1 (the fragments' versions summed).
SH, SF = 10, 2
S_VERSION = STEPS // (SH // SF) + SF - 1


def streaming_sets(data, **more):
    kv = dict(outer__inner_steps=SH, outer__fragments=SF)
    kv.update(more)
    return common_sets(data, **kv)


def streaming_parity(d, data):
    # One island with outer lr 1 and momentum 0 takes back what it pushed: with fragments and no
    # overlap, and with an overlap of 2 steps and mix 1 (the local parameters kept), it logs plain
    # training's losses; the version counts every fragment's rounds.
    base = dict(train__steps=30, outer__lr=1.0, outer__momentum=0.0)
    plain = os.path.join(d, "plain")
    p = Proc([LOOM, "train", CONFIG, "--run-dir", plain] + common_sets(data, **base),
             os.path.join(d, "plain.log"))
    if not check(p.wait(120) == 0, "plain loom train exits 0"):
        return
    a = metrics(plain)
    for name, more in (("no overlap", {}), ("overlap 2, mix 1", dict(outer__overlap=2, outer__mix=1.0))):
        common = streaming_sets(data, **dict(base, **more))
        tag = name.replace(" ", "_").replace(",", "")
        srv, port = start_server(d, "server_" + tag, common, os.path.join(d, "state_" + tag))
        if port is None:
            return
        isl = start_island(d, "island_" + tag, port, common, slowdown=None)
        rc = isl.wait(120)
        check(rc == 0 and "2 fragments" in isl.text(),
              "%s: the island joins with 2 fragments and exits 0 (rc %s)%s" % (
                  name, rc, "" if rc == 0 else ": " + isl.text()[-400:]))
        b = metrics(isl.run)
        worst = max((abs(x["loss"] - y["loss"]) / abs(x["loss"]) for x, y in zip(a, b)), default=1)
        check(len(a) == len(b) == 30 and worst <= 1e-5,
              "%s: 30 steps, per-step losses those of plain training (worst %.2g)" % (name, worst))
        want = 30 // (SH // SF) + SF - 1
        check(last_version(isl.run) == want, "%s: version %s (want %d)" % (
            name, last_version(isl.run), want))
        stop_server(srv)


def late_island_joins(d, started, common, want, extra=(), late_says=None, server_says=None,
                      never_dropped=False):
    """After kill_one_of_three: once the survivors reach version 4 an island (with `extra`) joins
    late; the survivors finish at version `want`, the late one trains to its end (its log holding
    `late_says`), the server drops the victim by its lease (and logs `server_says`) and stops at the
    version the late island saw last."""
    srv, port, isl, victim = started
    ok = wait_for(lambda: (last_version(isl[0].run) or 0) >= 4, 60, isl[:2])
    if not check(ok, "the survivors reach version 4"):
        return
    late = start_island(d, "late", port, common, extra=extra)
    for i, s in enumerate(isl[:2]):
        check_finished(s, s.wait(120), "survivor %d" % i, want)
    rc = late.wait(120)
    text = late.text()
    check(rc == 0 and (late_says is None or late_says in text),
          "the late island exits 0 (rc %s)%s%s" % (
              rc, "" if late_says is None else ", saying '%s'" % late_says,
              "" if rc == 0 else ": " + text[-800:]))
    steps = [x["step"] for x in metrics(late.run)]
    check(steps == list(range(1, STEPS + 1)), "the late island logs steps 1..%d" % STEPS)
    if never_dropped:
        check("dropped by the server" not in text and "rejected" not in text,
              "the late island is never dropped nor refused")
    log = srv.text()
    check(re.search(r"island \d+ \(\S+:%d [^)]*\) dropped: lease expired" % victim.pid, log),
          "the server drops the victim by lease expiry")
    if server_says is not None:
        check(re.search(server_says, log), "the server logs /%s/" % server_says)
    final, seen = stop_server(srv), last_version(late.run)
    check(final is not None and final == seen, "the server stops at the version the late island "
          "saw last (%s, %s)" % (final, seen))


def restarted_midrun(d, common, reach, want, extras=((), ())):
    """A fast island and a slow one (extras[0], extras[1] besides `common`); the server SIGKILLed
    once they reach version `reach` and restarted on its state: it resumes at least there, and the
    islands and the server end at version `want`."""
    state = os.path.join(d, "state")
    srv, port = start_server(d, "server", common, state)
    if port is None:
        return
    isl = [start_island(d, "fast", port, common, slowdown="5", extra=extras[0]),
           start_island(d, "slow", port, common, slowdown="25", extra=extras[1])]
    ok = wait_for(lambda: (last_version(isl[1].run) or 0) >= reach, 60, isl + [srv])
    if not check(ok, "the islands reach version %d" % reach):
        return
    srv.kill()
    time.sleep(0.3)
    srv2, port2 = start_server(d, "server2", common, state, listen="127.0.0.1:%d" % port)
    if port2 is None:
        return
    m = re.search(r"resumed from \S+: version (\d+)", srv2.text())
    check(m is not None and int(m.group(1)) >= reach, "the restarted server resumes at version %s"
          % (m and m.group(1)))
    check_finished(isl[0], isl[0].wait(120), "fast island", want)
    check_finished(isl[1], isl[1].wait(120), "slow island", want)
    check(stop_server(srv2) == want, "the server stops at version %d" % want)


def streaming_island_faults(d, data):
    # fragments 2, overlap 1, mix 0.5, int4 pushes: an island SIGKILLed after its first round is
    # dropped by its lease while the others go on; one that joins mid-run falls in with the cycle of
    # fragments (it waits on none that waits on it) and trains to its end.
    common = streaming_sets(data, outer__overlap=1, outer__mix=0.5, outer__compress="int4")
    started = kill_one_of_three(d, common)
    if started is not None:
        late_island_joins(d, started, common, S_VERSION, never_dropped=True)


def streaming_server_restarted(d, data):
    # fragments 2, overlap 1: the server SIGKILLed mid-run and restarted on its state; the islands
    # reconnect, push again what it lost, and end at the version of an undisturbed run.
    restarted_midrun(d, streaming_sets(data, outer__overlap=1), 3, S_VERSION)


DIPACO = dict(outer__modules="[1,2]")


def on_path(p):
    return sets(outer__path=p)


def dipaco_parity(d, data):
    base = dict(train__steps=30, outer__lr=1.0, outer__momentum=0.0)
    plain = os.path.join(d, "plain")
    p = Proc([LOOM, "train", CONFIG, "--run-dir", plain] + common_sets(data, **base),
             os.path.join(d, "plain.log"))
    if not check(p.wait(120) == 0, "plain loom train exits 0"):
        return
    common = common_sets(data, **dict(base, **DIPACO))
    srv, port = start_server(d, "server", common, os.path.join(d, "state"))
    if port is None:
        return
    isl = start_island(d, "island", port, common, slowdown=None, extra=on_path(1))
    rc = isl.wait(120)
    check(rc == 0 and "path 1 of 2" in isl.text(), "the island joins on path 1 of 2 and exits 0 "
          "(rc %s)%s" % (rc, "" if rc == 0 else ": " + isl.text()[-400:]))
    a, b = metrics(plain), metrics(isl.run)
    worst = max((abs(x["loss"] - y["loss"]) / abs(x["loss"]) for x, y in zip(a, b)), default=1)
    check(len(a) == len(b) == 30 and worst <= 1e-5,
          "30 steps, per-step losses those of plain training (worst %.2g)" % worst)
    stop_server(srv)


def dipaco_island_faults(d, data):
    common = common_sets(data, **DIPACO)
    started = kill_one_of_three(d, common, extras=[on_path(p) for p in (0, 1, 1)])
    if started is not None:
        late_island_joins(d, started, common, STEPS // H, extra=on_path(0),
                          late_says="path 0 of 2", server_says=r"joined at version \d+ on path 0")


def dipaco_server_restarted(d, data):
    restarted_midrun(d, common_sets(data, **DIPACO), 2, STEPS // H, extras=(on_path(0), on_path(1)))
    r = subprocess.run([LOOM, "dipaco", "eval", d], env=env(), capture_output=True, text=True,
                       timeout=60)
    check(r.returncode != 0 and "path_0" in r.stderr, "dipaco eval of a directory without paths: "
          "exit %s: %s" % (r.returncode, one_line(r.stderr)))


def bad_config(d, data):
    common = common_sets(data, train__steps=10)
    srv, port = start_server(d, "server", common, os.path.join(d, "state"))
    if port is None:
        return
    t0 = time.time()
    wrong = start_island(d, "wrong_token", port, common, slowdown=None, token="not-" + TOKEN)
    rc = wrong.wait(30)
    dt = time.time() - t0
    text = wrong.text()
    check(rc not in (0, None) and "token" in text and dt < 15,
          "wrong token: exit %s in %.1f s: %s" % (rc, dt, one_line(text)))
    other = start_island(d, "other_model", port, common, slowdown=None,
                         extra=sets(model__d_model=32, model__ffn_hidden=88))
    rc = other.wait(30)
    text = other.text()
    m = re.search(r"tensor \d+ is '([^']+)'", text)
    check(rc not in (0, None) and m is not None,
          "another model: exit %s naming tensor %s: %s" % (rc, m and m.group(1), one_line(text)))
    frag = start_island(d, "other_fragments", port, common, slowdown=None,
                        extra=sets(outer__inner_steps=10, outer__fragments=2))
    rc = frag.wait(30)
    text = frag.text()
    check(rc not in (0, None) and "splits the model into 2 fragment(s), the server into 1" in text,
          "other fragments: exit %s: %s" % (rc, one_line(text)))
    paths = start_island(d, "other_modules", port, common, slowdown=None,
                         extra=sets(outer__modules="[2]", outer__path=1))
    rc = paths.wait(30)
    text = paths.text()
    check(rc not in (0, None) and "modules make 2 path(s), the server's 0" in text,
          "DiPaCo island, plain server: exit %s: %s" % (rc, one_line(text)))
    check("joined" not in srv.text(), "the server let none of them join")
    # a second server on the port the first holds: refused (gRPC's SO_REUSEPORT would let both
    # serve, each with its own state, splitting the islands between them)
    r = subprocess.run([LOOM, "outer-server", CONFIG, "--listen", "127.0.0.1:%d" % port,
                        "--state-dir", os.path.join(d, "state_second"), "--port-file",
                        os.path.join(d, "second.port")] + common, env=env(), capture_output=True,
                       text=True, timeout=60)
    check(r.returncode == 1 and "cannot listen on 127.0.0.1:%d" % port in r.stderr
          and not os.path.exists(os.path.join(d, "second.port")),
          "a second server on a port in use: exit %s: %s" % (r.returncode, one_line(r.stderr)))
    # a second server on the state directory the first holds: refused before it reads the state
    # (two servers would overwrite each other's global parameters)
    r = subprocess.run([LOOM, "outer-server", CONFIG, "--listen", "127.0.0.1:0", "--state-dir",
                        os.path.join(d, "state"), "--port-file", os.path.join(d, "third.port")]
                       + common, env=env(), capture_output=True, text=True, timeout=60)
    check(r.returncode == 1 and "is in use" in r.stderr
          and not os.path.exists(os.path.join(d, "third.port")),
          "a second server on a state dir in use: exit %s: %s" % (r.returncode, one_line(r.stderr)))
    stop_server(srv)
    t0 = time.time()
    none = Proc([LOOM, "outer-server", CONFIG, "--listen", "127.0.0.1:0", "--state-dir",
                 os.path.join(d, "state_none"), "--port-file", os.path.join(d, "none.port")] + common,
                os.path.join(d, "no_token.log"), token=None)
    rc = none.wait(30)
    text = none.text()
    check(rc == 1 and "LOOM_OUTER_TOKEN" in text and not os.path.exists(os.path.join(d, "none.port")),
          "server without a token: exit %s in %.1f s: %s" % (rc, time.time() - t0, one_line(text)))
    # a state that cannot be written (a file size limit standing in for a full disk): exit 1, no
    # version served, nothing half-written left behind
    full = os.path.join(d, "state_full")
    os.makedirs(full)
    r = subprocess.run([LOOM, "outer-server", CONFIG, "--listen", "127.0.0.1:0", "--state-dir", full,
                        "--port-file", os.path.join(d, "full.port")] + common, env=env(),
                       capture_output=True, text=True, timeout=60,
                       preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (16384, 16384)))
    check(r.returncode == 1 and "cannot save the state" in r.stderr and "EFBIG" in r.stderr
          and [f for f in os.listdir(full) if f != ".lock"] == []
          and not os.path.exists(os.path.join(d, "full.port")),
          "server that cannot write its state: exit %s, left %s: %s"
          % (r.returncode, os.listdir(full), one_line(r.stderr)))
    # a garbage TLS certificate or key: named, not "is the port in use?"
    garbage = os.path.join(d, "garbage.pem")
    open(garbage, "w").write("not a certificate\n")
    for key in ("tls_cert", "tls_key"):
        other = "tls_key" if key == "tls_cert" else "tls_cert"
        good_pem = os.path.join(d, "good_%s.pem" % other)
        open(good_pem, "w").write("-----BEGIN CERTIFICATE-----\n-----BEGIN PRIVATE KEY-----\n")
        r = subprocess.run([LOOM, "outer-server", CONFIG, "--listen", "127.0.0.1:0", "--state-dir",
                            os.path.join(d, "state_tls"), "--set", 'outer.%s="%s"' % (key, garbage),
                            "--set", 'outer.%s="%s"' % (other, good_pem)] + common, env=env(),
                           capture_output=True, text=True, timeout=60)
        check(r.returncode == 1 and ("[outer] %s %s: not a PEM" % (key, garbage)) in r.stderr,
              "a garbage %s: exit %s: %s" % (key, r.returncode, one_line(r.stderr)))


SCENARIOS = [("1. island SIGKILLed mid-run", island_killed),
             ("2. island joining mid-run", island_joins),
             ("3. server SIGKILLed and restarted", server_restarted),
             ("3b. island SIGKILLed and restarted on its run dir", island_restarted),
             ("3c. async: an island SIGKILLed and restarted on its run dir", async_island_restarted),
             ("3d. async: server SIGKILLed and restarted", async_server_restarted),
             ("4. single island parity with plain training", single_island_parity),
             ("4b. an island of 2 plan ranks: parity with a one-process island", plan_island_parity),
             ("6. streaming: one island of 2 fragments logs plain training's losses", streaming_parity),
             ("7. streaming: an island SIGKILLed and one joining late (overlap, int4)",
              streaming_island_faults),
             ("8. streaming: server SIGKILLed and restarted", streaming_server_restarted),
             ("9. DiPaCo: one island on a path logs plain training's losses", dipaco_parity),
             ("9b. DiPaCo: an island SIGKILLed and one joining late", dipaco_island_faults),
             ("9c. DiPaCo: server SIGKILLed and restarted", dipaco_server_restarted),
             ("5. bad configuration", bad_config)]

# a SIGTERM (a harness timing the test out) still goes through the finally blocks that end the processes
signal.signal(signal.SIGTERM, lambda *_: sys.exit("outer faults: terminated"))
with tempfile.TemporaryDirectory() as tmp:
    data = os.path.join(tmp, "text.txt")
    write_pseudo_english(data)
    for i, (name, fn) in enumerate(SCENARIOS):
        if not name.startswith(ONLY):
            continue
        d = os.path.join(tmp, "s%d" % (i + 1))
        os.makedirs(d)
        print("== %s" % name, flush=True)
        t0 = time.time()
        try:
            fn(d, data)
        except Exception:
            check(False, "%s raised:\n%s" % (name, traceback.format_exc()))
        finally:
            reap_all()
        print("   (%.1f s)" % (time.time() - t0), flush=True)
print("outer faults: all passed" if not failures else "outer faults: %d FAILED" % failures)
sys.exit(1 if failures else 0)
