#!/usr/bin/env python3
"""DiLoCo against data parallelism at 20+ tokens per parameter and 100+ outer rounds (issue 16), at
the scale two cores allow in minutes: configs/tiny-llama.toml (125,248 parameters, byte-level, on
the default Gutenberg text), 4 islands of batch 4 x 64 tokens against one process of batch 16 (the
same tokens per step, the same steps, the same lr schedule), every run's validation loss on the same
16 held-out batches (the islands': the server's final global parameters).

    bench/islands/diloco_scale.py [--loom build/release/tools/loom/loom] [--out runs/diloco_scale]
        [--steps 3000] [--long-steps 10000] [--lrs 0.4,0.7,1.0] [--momentum 0.9]

Runs: dp (baseline, --steps), h30 for each outer lr (4 islands, H = 30), m1 (one island of batch
16, H = 30, the best lr), and, at --long-steps, dp-long and h100 (4 islands, H = 100, best lr).
Bytes: what the islands sent and received, measured; against a ring all-reduce of the f32 gradients
every step, in which each of N = 4 ranks sends and receives 2 (N-1)/N of them. Prints one JSON line per run and a summary.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "configs/tiny-llama.toml")
PARAMS = 125248
N = 4


def last_val(run_dir):
    val = None
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            j = json.loads(line)
            if j.get("val_loss") is not None:
                val = j["val_loss"]
    return val


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loom", default=os.path.join(ROOT, "build/release/tools/loom/loom"))
    ap.add_argument("--out", default=os.path.join(ROOT, "runs/diloco_scale"))
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--long-steps", type=int, default=10000)
    ap.add_argument("--lrs", default="0.4,0.7,1.0")
    ap.add_argument("--momentum", type=float, default=0.9)
    a = ap.parse_args()
    shutil.rmtree(a.out, ignore_errors=True)
    os.makedirs(a.out)
    env = dict(os.environ, OMP_WAIT_POLICY="passive")
    env.setdefault("LOOM_OUTER_TOKEN", os.urandom(16).hex())
    data = ["--set", "data.path=" + os.path.join(ROOT, "data/gutenberg"),
            "--set", "train.eval_batches=16", "--set", "train.warmup_steps=100"]
    rows = []

    def record(row):
        tokens = row["steps"] * 4 * 64 * N
        row["tokens_per_param"] = round(tokens / PARAMS, 1)
        # each rank sends and receives 2 (N-1)/N of the f32 gradients a step
        ring = 2 * 2 * (N - 1) / N * PARAMS * 4 * N * row["steps"]
        row["ring_allreduce_bytes"] = ring
        if row.get("bytes"):
            row["ring_over_these"] = round(ring / row["bytes"], 1)
        rows.append(row)
        print(json.dumps(row), flush=True)

    def dp(name, steps):
        run = os.path.join(a.out, name)
        t0 = time.time()
        subprocess.run([a.loom, "train", CONFIG, "--run-dir", run, "--set", "train.batch_size=16",
                        "--set", f"train.steps={steps}"] + data, check=True, env=dict(
                            env, OMP_NUM_THREADS="2"), stdout=subprocess.DEVNULL)
        record({"run": name, "steps": steps, "val_loss": last_val(run),
                "wall_s": round(time.time() - t0, 1), "bytes": 0})

    def islands(name, steps, h, lr, m=N, batch=4):
        run = os.path.join(a.out, name)
        subprocess.run([a.loom, "islands", CONFIG, "--islands", str(m), "--run-dir", run,
                        "--set", f"train.steps={steps}", "--set", f"train.batch_size={batch}",
                        "--set", f"outer.inner_steps={h}", "--set", f"outer.lr={lr}",
                        "--set", f"outer.momentum={a.momentum}"] + data,
                       check=True, env=env, stdout=subprocess.DEVNULL)
        with open(os.path.join(run, "summary.json")) as f:
            s = json.load(f)
        assert s["parameters"] == PARAMS, s["parameters"]
        record({"run": name, "steps": steps, "islands": m, "h": h, "outer_lr": lr,
                "outer_momentum": a.momentum, "rounds": s["version"], "val_loss": s["val_loss"],
                "wall_s": round(s["wall_s"], 1), "bytes": s["bytes_sent"] + s["bytes_received"]})

    dp("dp", a.steps)
    lrs = [float(x) for x in a.lrs.split(",")]
    for lr in lrs:
        islands(f"h30-lr{lr}", a.steps, 30, lr)
    best = min((r for r in rows if r["run"].startswith("h30")), key=lambda r: r["val_loss"])
    islands("m1", a.steps, 30, best["outer_lr"], m=1, batch=16)
    if a.long_steps:
        dp("dp-long", a.long_steps)
        islands("h100", a.long_steps, 100, best["outer_lr"])
    base = {r["steps"]: r["val_loss"] for r in rows if r["run"].startswith("dp")}
    for r in rows:
        r["vs_dp"] = round(100 * (r["val_loss"] / base[r["steps"]] - 1), 2)
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(rows, f, indent=2)
    for r in rows:
        print("%-12s steps %5d  val %.4f  vs dp %+.2f%%  %s" % (
            r["run"], r["steps"], r["val_loss"], r["vs_dp"],
            "ring/these %.0fx" % r["ring_over_these"] if r.get("ring_over_these") else ""))


if __name__ == "__main__":
    sys.exit(main())
