#!/usr/bin/env python3
"""Async against sync on the short case of issue 16 (`loom islands configs/tiny-llama.toml
--islands 4`, 300 steps, H = 10, a folder of plain-text files as data), with equal islands and with
island 0 slowed 3x, each run repeated; prints one JSON line per run and a summary. These runs last
about a second, of which start-up is a large part, and their final loss varies by several percent
from seed to seed: bench/islands/async_claim.py is the measure of async against sync.

    bench/islands/async_gap.py [--loom build/release/tools/loom/loom] [--repeats 2] [--seeds 0]
                               [--slow | --slow-only] [--out runs/async_gap]
                               [--config bench/diloco/diloco.toml --steps 1000 --h 50]

Each island is one process with one thread (`loom islands` gives each OMP_NUM_THREADS = cores / N),
so 4 islands on 2 cores take turns: "equal speed" is equal on average. val_loss is the server's final
global parameters on the same held-out batches.
"""
import argparse
import json
import os
import shutil
import statistics
import sys

from runs import LOOM, ROOT, run_islands, summary_row

TINY = "configs/tiny-llama.toml"


def islands(loom, out, name, mode, seed, slow, steps, h, config):
    # "async-noyield": async with [outer] yield off (every island at normal CPU priority)
    sets = [f"train.steps={steps}", f"outer.inner_steps={h}",
            f"outer.mode={mode.split('-')[0]}", f"train.seed={seed}", "train.eval_batches=16"]
    if mode == "async-noyield":
        sets.append("outer.yield=false")
    if config == TINY:  # it names no data
        sets.append("data.path=" + os.path.join(ROOT, "data/gutenberg"))
    run_dir = os.path.join(out, name)
    shutil.rmtree(run_dir, ignore_errors=True)
    s = run_islands(loom, os.path.join(ROOT, config), run_dir, 4, sets, slow="3" if slow else None,
                    quiet=True)
    row = {"run": name, "mode": mode, "seed": seed, "slow": slow, **summary_row(s, run_dir)}
    print(json.dumps(row), flush=True)
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loom", default=LOOM)
    ap.add_argument("--out", default=os.path.join(ROOT, "runs/async_gap"))
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--h", type=int, default=10)
    ap.add_argument("--config", default=TINY, help="relative to the repository")
    ap.add_argument("--slow", action="store_true", help="also the runs with island 0 slowed 3x")
    ap.add_argument("--slow-only", action="store_true", help="only the runs with island 0 slowed")
    ap.add_argument("--modes", default="sync,async",
                    help="of sync, async, async-noyield (async, [outer] yield off); sync first")
    a = ap.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")
    rows = []
    for r in range(a.repeats):
        for seed in [int(s) for s in a.seeds.split(",")]:
            for slow in [True] if a.slow_only else [False, True] if a.slow else [False]:
                tag = f"{'slow-' if slow else ''}s{seed}-{r}"
                for mode in a.modes.split(","):
                    rows.append(islands(a.loom, a.out, f"{mode}-{tag}", mode, seed, slow, a.steps,
                                        a.h, a.config))
    sync = {(r["seed"], r["slow"]): r["val_loss"] for r in rows if r["mode"] == "sync"}
    summary = {}
    for row in rows:
        summary.setdefault(f"{row['mode']}{' slow' if row['slow'] else ''}", []).append(row)
    for key, rs in summary.items():
        d = [r["val_loss"] / sync[(r["seed"], r["slow"])] - 1 for r in rs]
        print(json.dumps({"case": key, "val_loss_median": round(statistics.median(
            r["val_loss"] for r in rs), 4), "vs_sync_same_seed_median": round(statistics.median(d), 4),
            "wall_s_median": statistics.median(r["wall_s"] for r in rs),
            "wait_share_max": max(r["wait_share_max"] for r in rs),
            **({"ahead_share_median": statistics.median(r["ahead_share"] for r in rs)}
               if all("ahead_share" in r for r in rs) else {})}))


if __name__ == "__main__":
    sys.exit(main())
