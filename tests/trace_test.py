#!/usr/bin/env python3
"""loom bench --trace and loom train --trace write a Chrome trace (the JSON Perfetto opens): one
process per rank, each with a "compute" and a "comm" thread, complete events with a name, an op and
bytes. With [passes] prefetch on, collectives run on each rank's communication thread, so comm events
overlap compute events of the same rank; with it off they run on the compute thread and never do (the
negative control that makes the overlap check mean something). loom bench also reports
exposed_comm_ms, collectives_per_step and activation_bytes. A trace path that cannot be written is an
error naming it.

    trace_test.py LOOM_BINARY SOURCE_DIR
"""
import json
import os
import subprocess
import sys
import tempfile

from checks import Checks
from textdata import write_pseudo_english

LOOM, SRC = sys.argv[1], sys.argv[2]
checks = Checks()
check = checks.check
ENV = dict(os.environ, OMP_NUM_THREADS="2", OMP_WAIT_POLICY="passive")
STEPS = 6
PLAN = ["--set", "plan.mesh={data=2}", "--set", "plan.ranks=local",
        "--set", 'plan.tactics=[{kind="fsdp",axis="data"},{kind="data",axis="data"}]']


def loom(*args):
    return subprocess.run([LOOM, *args], cwd=SRC, capture_output=True, text=True, timeout=300, env=ENV)


def lanes(trace):
    """{(pid, tid): [(start, end, name, op, bytes)]} of the complete events, and the thread names."""
    events, names = {}, {}
    for e in trace["traceEvents"]:
        if e["ph"] == "M" and e["name"] == "thread_name":
            names[(e["pid"], e["tid"])] = e["args"]["name"]
        elif e["ph"] == "X":
            events.setdefault((e["pid"], e["tid"]), []).append(
                (e["ts"], e["ts"] + e["dur"], e["name"], e["args"]["op"], e["args"]["bytes"]))
    return events, names


def overlaps(events, pid):
    """How many comm events of rank pid overlap a compute event (not a wait) of the same rank."""
    compute = sorted((s, t) for s, t, name, op, _ in events.get((pid, 0), []) if op != "wait")
    n = 0
    for s, t, *_ in events.get((pid, 1), []):
        # strictly inside: a shared endpoint is not overlap
        n += any(cs < t and s < ct for cs, ct in compute)
    return n


with tempfile.TemporaryDirectory() as tmp:
    for prefetch in ("true", "false"):
        path = os.path.join(tmp, "bench_%s.json" % prefetch)
        r = loom("bench", "configs/tiny-llama.toml", "--steps", str(STEPS), "--warmup", "1", *PLAN,
                 "--set", "passes.prefetch=" + prefetch, "--trace", path)
        check("bench --trace (prefetch %s) runs" % prefetch, r.returncode == 0, r.stderr[-2000:])
        if r.returncode != 0:
            continue
        line = json.loads(r.stdout.strip().splitlines()[-1])
        check("bench JSON has exposed_comm_ms, collectives_per_step, activation_bytes",
              line.get("exposed_comm_ms", -1) >= 0 and line.get("collectives_per_step", 0) > 0 and
              line.get("activation_bytes", 0) > 0 and
              all("exposed_comm_ms" in p for p in line["per_rank"]), str(line))
        try:
            trace = json.load(open(path))
        except (OSError, ValueError) as e:
            check("the trace is valid JSON", False, str(e))
            continue
        events, names = lanes(trace)
        check("both lanes per rank, named",
              all(names.get((p, 0)) == "compute" and names.get((p, 1)) == "comm" and
                  events.get((p, 0)) and events.get((p, 1)) for p in (0, 1)), str(names))
        comm_ops = {op for p in (0, 1) for *_, op, _ in events.get((p, 1), [])}
        check("the comm lane holds the collectives",
              {"all_gather", "reduce_scatter"} <= comm_ops, str(comm_ops))
        per_step = line["collectives_per_step"]
        check("one comm event per collective of the timed steps",
              all(len(events[(p, 1)]) == STEPS * per_step for p in (0, 1)),
              "%s vs %d x %s" % ([len(events[(p, 1)]) for p in (0, 1)], STEPS, per_step))
        check("compute events have names, ops and bytes",
              all(name and op and b >= 0 and t >= s for s, t, name, op, b in events[(0, 0)]))
        n = [overlaps(events, p) for p in (0, 1)]
        if prefetch == "true":
            # a timing, so only "somewhere": on a loaded machine a rank's communication thread may
            # get a core only while its compute waits
            check("prefetch: comm overlaps compute", sum(n) > 0, str(n))
        else:
            check("no prefetch: comm never overlaps compute", n == [0, 0], str(n))

    path, text = os.path.join(tmp, "train.json"), os.path.join(tmp, "text.txt")
    write_pseudo_english(text)
    r = loom("train", "configs/tiny-llama.toml", "--run-dir", os.path.join(tmp, "run"), *PLAN,
             "--set", "train.steps=4", "--set", "train.seq_len=32", "--set", "data.path=" + text,
             "--trace", path, "--trace-steps", "2")
    check("train --trace runs", r.returncode == 0, r.stderr[-2000:])
    if r.returncode == 0:
        events, names = lanes(json.load(open(path)))
        check("train trace: two ranks, two lanes each",
              sorted(names) == [(0, 0), (0, 1), (1, 0), (1, 1)] and all(events.get(k) for k in names),
              str(sorted(names)))

    bad = os.path.join(tmp, "no", "such", "dir", "t.json")
    r = loom("bench", "configs/tiny-llama.toml", "--steps", "1", "--warmup", "0", "--trace", bad)
    check("an unwritable trace path: exit 1 naming it", r.returncode == 1 and bad in r.stderr,
          r.stderr[-2000:])
    r = loom("train", "configs/tiny-llama.toml", "--run-dir", os.path.join(tmp, "run2"),
             "--set", "train.steps=2", "--set", "data.path=" + text, "--trace", bad)
    check("train: an unwritable trace path is an error before training",
          r.returncode == 1 and bad in r.stderr and not os.path.exists(os.path.join(tmp, "run2")),
          r.stderr[-2000:])

checks.finish()
