#!/usr/bin/env python3
"""Async against sync with equal-speed islands, and with one island slowed 3x: the case of issue 16
(`loom islands configs/tiny-llama.toml --islands 4`, 300 steps, H = 10, a folder of plain-text files
as data), each run repeated; prints one JSON line per run and a summary.

    bench/islands/async_gap.py [--loom build/release/tools/loom/loom] [--repeats 2]
                               [--graces 0,1] [--slow | --slow-only] [--out runs/async_gap]
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

from runs import LOOM, ROOT, run_islands

TINY = "configs/tiny-llama.toml"


def islands(loom, out, name, mode, grace, slow, steps, h, config):
    sets = [f"train.steps={steps}", f"outer.inner_steps={h}", f"outer.mode={mode}",
            f"outer.grace={grace}", "train.eval_batches=16"]
    if config == TINY:  # it names no data
        sets.append("data.path=" + os.path.join(ROOT, "data/gutenberg"))
    run_dir = os.path.join(out, name)
    shutil.rmtree(run_dir, ignore_errors=True)
    s = run_islands(loom, os.path.join(ROOT, config), run_dir, 4, sets, slow="3" if slow else None,
                    quiet=True)
    row = {"run": name, "mode": mode, "grace": grace if mode == "async" else None,
           "slow": slow, "val_loss": s["val_loss"], "version": s["version"],
           "wall_s": round(s["wall_s"], 1),
           "island_steps": [i["steps"] for i in s["per_island"]]}
    print(json.dumps(row), flush=True)
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loom", default=LOOM)
    ap.add_argument("--out", default=os.path.join(ROOT, "runs/async_gap"))
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--graces", default="0,1")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--h", type=int, default=10)
    ap.add_argument("--config", default=TINY, help="relative to the repository")
    ap.add_argument("--slow", action="store_true", help="also the runs with island 0 slowed 3x")
    ap.add_argument("--slow-only", action="store_true", help="only the runs with island 0 slowed")
    a = ap.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")
    rows = []
    for r in range(a.repeats):
        for slow in [True] if a.slow_only else [False, True] if a.slow else [False]:
            tag = f"{'slow-' if slow else ''}{r}"
            rows.append(islands(a.loom, a.out, f"sync-{tag}", "sync", 0, slow, a.steps, a.h,
                                a.config))
            for g in a.graces.split(","):
                rows.append(islands(a.loom, a.out, f"async-g{g}-{tag}", "async", float(g), slow,
                                    a.steps, a.h, a.config))
    summary = {}
    for row in rows:
        key = f"{row['mode']}{'' if row['grace'] is None else ' grace ' + str(row['grace'])}" \
              f"{' slow' if row['slow'] else ''}"
        summary.setdefault(key, []).append(row)
    for key, rs in summary.items():
        v = [r["val_loss"] for r in rs]
        w = [r["wall_s"] for r in rs]
        print(json.dumps({"case": key, "val_loss_median": round(statistics.median(v), 4),
                          "val_losses": v, "wall_s_median": statistics.median(w)}))


if __name__ == "__main__":
    sys.exit(main())
