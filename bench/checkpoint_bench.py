#!/usr/bin/env python3
"""Checkpoints written at once against written while training goes on ([checkpoint] async), beside
a run that writes only its last, on the same ranks, model, data and steps:

    bench/checkpoint_bench.py [--config C] [--rounds N] [--steps S] [--every E] [--ranks R]

`loom train` of bench-llama (34.1 M parameters, f32) under fsdp on R mpirun ranks x 1 thread (R = 1:
one process of 1 thread, no plan, a whole checkpoint), S steps on pseudo-English text, a checkpoint every E steps ("sync", "async") or only at the end
("none"), the three alternated N times so all see the same machine load; each rank runs under
/usr/bin/time for its peak RSS. Prints one JSON line per run, then the summary: per mode the median
wall time, the median seconds the loop spent in a checkpoint and the write's own seconds (from
metrics.jsonl: rank 0), the cost of a checkpoint against "none" ((wall - none's) / (checkpoints
- 1): the last checkpoint is in every mode), and the peak RSS of each rank.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

SRC = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(SRC, "tests"))
from textdata import write_pseudo_english  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--config", default=os.path.join(SRC, "configs", "bench-llama.toml"))
ap.add_argument("--rounds", type=int, default=2)
ap.add_argument("--steps", type=int, default=8)
ap.add_argument("--every", type=int, default=2)
ap.add_argument("--ranks", type=int, default=2)
ap.add_argument("--loom", default=os.path.join(SRC, "build", "release", "tools", "loom", "loom"))
a = ap.parse_args()
if not os.access(a.loom, os.X_OK):
    sys.exit("build first: scripts/setup.sh")
if a.steps < 2 * a.every:
    sys.exit("--steps must hold at least two checkpoints (2 x --every)")

MODES = {"none": ["checkpoint.every=0"],
         "sync": ["checkpoint.every=%d" % a.every, "checkpoint.async=false"],
         "async": ["checkpoint.every=%d" % a.every, "checkpoint.async=true"]}
env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="passive")
mpirun = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
          "-x", "OMP_NUM_THREADS", "-x", "OMP_WAIT_POLICY", "-np", str(a.ranks)]
rows = []
with tempfile.TemporaryDirectory() as d:
    data = os.path.join(d, "text.txt")
    write_pseudo_english(data)
    for rnd in range(a.rounds):
        for mode, sets in MODES.items():
            run = os.path.join(d, mode)
            shutil.rmtree(run, ignore_errors=True)
            rss = os.path.join(d, "rss")
            train = [a.loom, "train", a.config, "--run-dir", run, "--set", "data.path=" + data,
                     "--set", "train.steps=%d" % a.steps, "--set", "train.eval_every=100000",
                     "--set", "checkpoint.keep=2"]
            if a.ranks > 1:
                cmd = mpirun + ["bash", "-c",
                                '/usr/bin/time -f %M -o "$0.$OMPI_COMM_WORLD_RANK" "$@"', rss] + \
                    train + ["--set", "plan.mesh={data=%d}" % a.ranks,
                             "--set", 'plan.tactics=[{kind="fsdp",axis="data"},'
                                      '{kind="data",axis="data"}]',
                             "--set", "plan.ranks=mpi"]
            else:  # one process, no plan: a whole checkpoint, one core left to the writer
                cmd = ["/usr/bin/time", "-f", "%M", "-o", rss + ".0"] + train
            for s in sets:
                cmd += ["--set", s]
            t0 = time.time()
            r = subprocess.run(cmd, env=env, capture_output=True, text=True)
            wall = time.time() - t0
            if r.returncode != 0:
                sys.exit("%s run exited %d: %s" % (mode, r.returncode, r.stderr[-2000:]))
            metrics = [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl"))]
            ck = [m for m in metrics if "checkpoint_step" in m]
            row = {"round": rnd, "mode": mode, "wall_s": round(wall, 2),
                   "checkpoints": a.steps // a.every if mode != "none" else 1,
                   "checkpoint_blocked_s": [round(m["checkpoint_blocked_s"], 3) for m in ck],
                   "checkpoint_write_s": [round(m["checkpoint_write_s"], 3) for m in ck],
                   "checkpoint_mb": ck[0]["checkpoint_mb"] if ck else None,
                   "peak_rss_mb": [round(int(open("%s.%d" % (rss, k)).read().split()[-1]) / 1024,
                                         1) for k in range(a.ranks)]}
            print(json.dumps(row), flush=True)
            rows.append(row)
summary = {}
none = statistics.median(r["wall_s"] for r in rows if r["mode"] == "none")
for mode in MODES:
    rs = [r for r in rows if r["mode"] == mode]
    wall = statistics.median(r["wall_s"] for r in rs)
    blocked = [x for r in rs for x in r["checkpoint_blocked_s"]]
    write = [x for r in rs for x in r["checkpoint_write_s"]]
    summary[mode] = {
        "wall_s": wall, "walls": [r["wall_s"] for r in rs],
        "per_checkpoint_s": None if mode == "none" else round(
            (wall - none) / (rs[0]["checkpoints"] - 1), 3),
        "blocked_s_median": statistics.median(blocked) if blocked else None,
        "write_s_median": statistics.median(write) if write else None,
        "checkpoint_mb_per_rank0": rs[0]["checkpoint_mb"],
        "peak_rss_mb": [max(r["peak_rss_mb"][k] for r in rs) for k in range(a.ranks)]}
print(json.dumps({"summary": summary, "steps": a.steps, "every": a.every, "ranks": a.ranks}))
