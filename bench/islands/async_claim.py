#!/usr/bin/env python3
"""Asynchronous islands against synchronous DiLoCo on the cases of issue 32, several seeds:

  equal   4 islands of equal speed
  slow    island 0 three times slower (--slow 0=3)
  speeds  speeds 1, 1, 2, 4 (--slow 0=4 --slow 1=4 --slow 2=2)
  stall   island 3 stalls at the middle step for a fifth of the run: a quarter of the seed's
          synchronous equal-island wall time, so a fifth of the synchronous run with the stall

    bench/islands/async_claim.py [--loom build/release/tools/loom/loom] [--seeds 0,1,2]
        [--cases equal,slow,speeds,stall] [--sync-cases equal] [--steps 1000] [--h 50]
        [--async-steps 1000] [--config bench/diloco/diloco.toml] [--out runs/async_claim]
        [--no-yield] [--reuse-sync]

Synchronous DiLoCo's model does not depend on the islands' speeds (a round waits for all), so its
final loss per seed comes from the equal-island run; its wall time with slow islands is measured
for the cases in --sync-cases (each once per seed listed). Async runs with equal islands take the
same budget as sync (4 x --steps inner steps); in the other cases 4 x --async-steps (larger than
--steps gives async a larger budget, and its schedule spans it). Prints one JSON
line per run, then per case the medians and ranges: async's final validation loss against sync's
of the same seed, async's wall time against sync's of the same case, and the most any island
waited for the server (share of its wall time).
"""
import argparse
import json
import os
import shutil
import statistics
import sys

from runs import LOOM, ROOT, island_env, run_islands, summary_row

CASES = {"equal": [], "slow": ["0=3"], "speeds": ["0=4", "1=4", "2=2"], "stall": []}


def one(a, case, mode, seed, steps, stall_s=None):
    sets = [f"train.steps={steps}", f"outer.inner_steps={a.h}", f"outer.mode={mode}",
            f"train.seed={seed}"]
    name = f"{case}-{mode}-{steps}-s{seed}"
    if mode == "async" and a.no_yield:
        sets.append("outer.yield=false")
        name += "-noyield"
    run_dir = os.path.join(a.out, name)
    summary = os.path.join(run_dir, "summary.json")
    if mode == "sync" and a.reuse_sync and os.path.exists(summary):
        with open(summary) as f:  # sync's earlier run of this case and seed, in --out
            s = json.load(f)
    else:
        shutil.rmtree(run_dir, ignore_errors=True)
        stalls = [f"3={steps // 2}:{stall_s:.1f}"] if case == "stall" else []
        s = run_islands(a.loom, os.path.join(ROOT, a.config), run_dir, 4, sets,
                        slow=CASES[case], env=island_env(), quiet=True, stalls=stalls)
    row = {"case": case, "mode": mode, "seed": seed, "steps": steps, **summary_row(s, run_dir)}
    if stall_s:
        row["stall_s"] = round(stall_s, 1)
    print(json.dumps(row), flush=True)
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loom", default=LOOM)
    ap.add_argument("--out", default=os.path.join(ROOT, "runs/async_claim"))
    ap.add_argument("--config", default="bench/diloco/diloco.toml")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--cases", default="equal,slow,speeds,stall")
    ap.add_argument("--sync-cases", default="equal",
                    help="cases whose synchronous wall time is measured (equal always is)")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--async-steps", type=int, default=0,
                    help="async's [train] steps in the unequal cases; default --steps")
    ap.add_argument("--h", type=int, default=50)
    ap.add_argument("--no-yield", action="store_true",
                    help="async with [outer] yield off (every island at normal CPU priority)")
    ap.add_argument("--reuse-sync", action="store_true",
                    help="take sync's runs already in --out instead of running them again")
    a = ap.parse_args()
    asteps = a.async_steps or a.steps
    cases = a.cases.split(",")
    sync_cases = set(a.sync_cases.split(",")) | {"equal"}
    rows = []
    for seed in [int(s) for s in a.seeds.split(",")]:
        base = one(a, "equal", "sync", seed, a.steps)
        rows.append(base)
        stall_s = base["wall_s"] / 4
        for case in cases:
            if case != "equal" and case in sync_cases:
                rows.append(one(a, case, "sync", seed, a.steps, stall_s))
            rows.append(one(a, case, "async", seed, a.steps if case == "equal" else asteps,
                            stall_s))
    sync_loss = {r["seed"]: r["val_loss"] for r in rows if r["mode"] == "sync"}
    sync_wall = {}
    for r in rows:
        if r["mode"] == "sync":
            sync_wall.setdefault(r["case"], []).append(r["wall_s"])
    for case in cases:
        rs = [r for r in rows if r["case"] == case and r["mode"] == "async"]
        dloss = [r["val_loss"] / sync_loss[r["seed"]] - 1 for r in rs]
        out = {"case": case, "seeds": len(rs), "async_steps": rs[0]["steps"] if rs else None,
               "async_val_loss_vs_sync_median": round(statistics.median(dloss), 4),
               "range": [round(min(dloss), 4), round(max(dloss), 4)],
               "async_wall_s_median": statistics.median(r["wall_s"] for r in rs),
               "wait_share_max": max((r["wait_share_max"] or 0) for r in rs)}
        if case in sync_wall:
            w = statistics.median(sync_wall[case])
            out["sync_wall_s_median"] = w
            out["async_wall_vs_sync_median"] = round(
                statistics.median(r["wall_s"] for r in rs) / w, 3)
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    sys.exit(main())
