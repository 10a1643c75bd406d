#!/usr/bin/env python3
"""DiLoCo against data parallelism at 20+ tokens per parameter and 100+ outer rounds (issue 16), at
the scale two cores allow in minutes: configs/tiny-llama.toml (125,248 parameters, byte-level, on
the default Gutenberg text), 4 islands of batch 4 x 64 tokens against one process of batch 16 (the
same tokens per step, the same steps, the same lr schedule), every run's validation loss on the same
16 held-out batches (the islands': the server's final global parameters).

    bench/islands/diloco_scale.py [--loom build/release/tools/loom/loom] [--out runs/diloco_scale]
        [--steps 3000] [--long-steps 10000] [--lrs 0.4,0.7,1.0] [--momentum 0.9]
        [--config configs/tiny-llama.toml --data data/gutenberg --batch 4 --seq 64]

At 1.26M parameters (bench/diloco/diloco.toml, BPE 2048, 20 tokens per parameter at 6,200 steps):
    --config bench/diloco/diloco.toml --data data/gutenberg-bpe2048 --batch 8 --seq 128

Runs: dp (baseline, --steps), h30 for each outer lr (4 islands, H = 30), m1 (one island of batch
16, H = 30, the best lr), and, at --long-steps, dp-long and h100 (4 islands, H = 100, best lr).
Bytes: what the islands sent and received, measured; against a ring all-reduce of the f32 gradients
every step, in which each of N = 4 ranks sends and receives 2 (N-1)/N of them. Prints one JSON line
per run and a summary.
"""
import argparse
import json
import os
import shutil
import sys

from runs import LOOM, ROOT, island_env, last_val, run_islands, timed

N = 4


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loom", default=LOOM)
    ap.add_argument("--out", default=os.path.join(ROOT, "runs/diloco_scale"))
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--long-steps", type=int, default=10000)
    ap.add_argument("--lrs", default="0.4,0.7,1.0")
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--config", default=os.path.join(ROOT, "configs/tiny-llama.toml"))
    ap.add_argument("--data", default=os.path.join(ROOT, "data/gutenberg"))
    ap.add_argument("--batch", type=int, default=4, help="each island's batch")
    ap.add_argument("--seq", type=int, default=64, help="tokens per sequence ([train] seq_len)")
    a = ap.parse_args()
    shutil.rmtree(a.out, ignore_errors=True)
    os.makedirs(a.out)
    env = island_env()
    # every run's: the data, the validation batches, the warmup
    data = ["data.path=" + a.data, f"train.seq_len={a.seq}", "train.eval_batches=16",
            "train.warmup_steps=100"]
    rows = []
    params = []  # the model's, from an islands summary

    def record(row):
        rows.append(row)
        print(json.dumps(row), flush=True)

    def dp(name, steps):
        run = os.path.join(a.out, name)
        wall = timed([a.loom, "train", a.config, "--run-dir", run,
                      "--set", f"train.batch_size={N * a.batch}",
                      "--set", f"train.steps={steps}"] + [x for d in data for x in ("--set", d)],
                     dict(env, OMP_NUM_THREADS="2"),
                     quiet=True)
        record({"run": name, "steps": steps, "val_loss": last_val(run), "wall_s": round(wall, 1),
                "bytes": 0})

    def islands(name, steps, h, lr, m=N, batch=a.batch):
        s = run_islands(a.loom, a.config, os.path.join(a.out, name), m,
                        [f"train.steps={steps}", f"train.batch_size={batch}",
                         f"outer.inner_steps={h}", f"outer.lr={lr}",
                         f"outer.momentum={a.momentum}"] + data, env=env, quiet=True)
        params.append(s["parameters"])
        record({"run": name, "steps": steps, "islands": m, "h": h, "outer_lr": lr,
                "outer_momentum": a.momentum, "rounds": s["version"], "val_loss": s["val_loss"],
                "wall_s": round(s["wall_s"], 1), "bytes": s["bytes_sent"] + s["bytes_received"]})

    dp("dp", a.steps)
    lrs = [float(x) for x in a.lrs.split(",")]
    for lr in lrs:
        islands(f"h30-lr{lr}", a.steps, 30, lr)
    best = min((r for r in rows if r["run"].startswith("h30")), key=lambda r: r["val_loss"])
    islands("m1", a.steps, 30, best["outer_lr"], m=1, batch=N * a.batch)
    if a.long_steps:
        dp("dp-long", a.long_steps)
        islands("h100", a.long_steps, 100, best["outer_lr"])
    base = {r["steps"]: r["val_loss"] for r in rows if r["run"].startswith("dp")}
    for r in rows:
        r["vs_dp"] = round(100 * (r["val_loss"] / base[r["steps"]] - 1), 2)
        r["tokens_per_param"] = round(r["steps"] * a.batch * a.seq * N / params[0], 1)
        # a ring all-reduce of the f32 gradients every step: each rank sends and receives
        # 2 (N-1)/N of them
        r["ring_allreduce_bytes"] = 2 * 2 * (N - 1) / N * params[0] * 4 * N * r["steps"]
        if r["bytes"]:
            r["ring_over_these"] = round(r["ring_allreduce_bytes"] / r["bytes"], 1)
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(rows, f, indent=2)
    for r in rows:
        print("%-12s steps %5d  val %.4f  vs dp %+.2f%%  %s" % (
            r["run"], r["steps"], r["val_loss"], r["vs_dp"],
            "ring/these %.0fx" % r["ring_over_these"] if r.get("ring_over_these") else ""))


if __name__ == "__main__":
    sys.exit(main())
