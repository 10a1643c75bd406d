#!/usr/bin/env python3
"""The DiLoCo experiment: 4 islands with H inner steps between outer syncs against the synchronous
baseline on the same tokens, and async against sync mode with one island slowed 3x.

    bench/diloco/run.py [--loom build/release/tools/loom/loom] [--out runs/diloco] [--steps 1000]

Runs (config bench/diloco/diloco.toml; all on this machine, one after another):
  baseline     one process, batch 8 x grad_accum 4 = 32 rows per step, [train] steps steps
  h{H}         loom islands --islands 4, each island batch 8 for [train] steps inner steps, outer
               Nesterov (lr 0.7, momentum 0.9) every H steps; H in --hs; plus H=50 with bf16 pushes
  slow-sync    4 islands, H=50, island 0 sleeping so each of its steps takes 3x as long
  slow-async   the same in async mode (Delayed Nesterov, slow islands take fewer local steps)
  slow-async-long  the same with [train] steps (schedule, step budget) 30% longer

Every run evaluates with the same validation batches (loom train's validation_loss); an island run's
final figure is the server's final global parameters. Writes OUT/results.json, OUT/results.md (the
table for docs/benchmarks.md) and OUT/report.html (loom report of the validation curves).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bench", "islands"))
from runs import LOOM, island_env, last_val, run_islands  # noqa: E402

CONFIG = os.path.join(HERE, "diloco.toml")
N = 4


def run(cmd, env):
    print("+", " ".join(cmd), flush=True)
    t0 = time.time()
    subprocess.run(cmd, check=True, env=env, cwd=ROOT)
    return time.time() - t0


def metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loom", default=LOOM)
    ap.add_argument("--out", default=os.path.join(ROOT, "runs/diloco"))
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--hs", default="10,50,100")
    ap.add_argument("--skip-slow", action="store_true", help="leave out the slow-island pair")
    a = ap.parse_args()
    if os.path.exists(a.out):
        shutil.rmtree(a.out)
    os.makedirs(a.out)
    env = island_env()
    common = ["--set", "train.steps=%d" % a.steps]
    results = {"config": os.path.relpath(CONFIG, ROOT), "steps": a.steps, "islands": N, "runs": []}

    base = os.path.join(a.out, "baseline")
    wall = run([a.loom, "train", CONFIG, "--run-dir", base, "--set", "train.grad_accum=%d" % N]
               + common, dict(env, OMP_NUM_THREADS="2"))
    results["runs"].append({"name": "baseline", "val_loss": last_val(base), "wall_s": wall,
                            "bytes": 0})

    def islands(name, sets, slow=None):
        s = run_islands(a.loom, CONFIG, os.path.join(a.out, name), N,
                        ["train.steps=%d" % a.steps] + sets, slow=slow,
                        env=dict(env, OMP_NUM_THREADS="1"))
        results["parameters"] = s["parameters"]
        r = {"name": name, "mode": s["mode"], "H": s["inner_steps"], "compress": s["compress"],
             "val_loss": s["val_loss"], "wall_s": s["wall_s"], "version": s["version"],
             "bytes": s["bytes_sent"] + s["bytes_received"], "bytes_sent": s["bytes_sent"],
             "bytes_received": s["bytes_received"],
             "island_steps": [i["steps"] for i in s["per_island"]]}
        results["runs"].append(r)
        return r

    for h in [int(x) for x in a.hs.split(",")]:
        islands("h%d" % h, ["outer.inner_steps=%d" % h])
    islands("h50-bf16", ["outer.inner_steps=50", "outer.compress=bf16"])
    if not a.skip_slow:
        islands("slow-sync", ["outer.inner_steps=50"], slow="3")
        islands("slow-async", ["outer.inner_steps=50", "outer.mode=async"], slow="3")
        # the same with a 30% longer horizon (schedule and step budget): async spends the time a sync
        # run waits for its straggler on training
        islands("slow-async-long", ["outer.inner_steps=50", "outer.mode=async",
                                    "train.steps=%d" % (a.steps * 13 // 10)], slow="3")

    # Async against sync with a straggler: when does each run's global model (evaluated by island 1, a
    # fast one, right after its pulls) first reach the sync run's final validation loss?
    by = {r["name"]: r for r in results["runs"]}
    if "slow-sync" in by and "slow-async" in by:
        target = by["slow-sync"]["val_loss"]
        for name in ("slow-sync", "slow-async", "slow-async-long"):
            if name not in by:
                continue
            curve = [(j["elapsed_s"], j["val_loss"]) for j in metrics(os.path.join(a.out, name, "island_1"))
                     if j.get("val_loss") is not None and j["step"] > 1]
            hit = next((t for t, v in curve if v <= target * 1.0005), None)
            by[name]["curve"] = curve
            by[name]["seconds_to_sync_final"] = hit

    # What the synchronous baseline would move as data parallelism on N workers: every step, a ring
    # all-reduce of the f32 gradients, in which each worker sends and receives 2 (N-1)/N of them.
    P = results["parameters"]
    ring = a.steps * N * 2 * (2 * (N - 1) / N) * 4 * P
    results["baseline_ring_allreduce_bytes"] = ring
    b = results["runs"][0]["val_loss"]
    lines = ["| run | outer syncs | final val loss | vs baseline | bytes moved (all islands) | "
             "ring all-reduce bytes / these | wall s |", "|---|---|---|---|---|---|---|"]
    for r in results["runs"]:
        if r["name"] == "baseline":
            lines.append("| baseline (1 process, 4x batch) | %d steps | %.4f | | (DDP-equivalent: %.3g) | 1x | %.0f |"
                         % (a.steps, r["val_loss"], ring, r["wall_s"]))
            continue
        rel = (r["val_loss"] - b) / b * 100
        lines.append("| %s (%s, H=%d, push %s) | %d | %.4f | %+.2f%% | %.3g | %.0fx | %.0f |"
                     % (r["name"], r["mode"], r["H"], r["compress"], r["version"], r["val_loss"], rel,
                        r["bytes"], ring / r["bytes"], r["wall_s"]))
    for name in ("slow-sync", "slow-async", "slow-async-long"):
        r = by.get(name)
        if r and "curve" in r:
            t = r["seconds_to_sync_final"]
            lines.append("")
            lines.append("%s: island 1 first sees val loss <= %.4f (slow-sync's final) after %s s; the run "
                         "took %.0f s; island steps %s" % (name, by["slow-sync"]["val_loss"],
                                                          "%.0f" % t if t is not None else "never",
                                                          r["wall_s"], r["island_steps"]))
    md = ("Model: %s, %d parameters; %d islands x %d inner steps x batch %d x %d tokens = %d "
          "training tokens per run.\n\n" % (results["config"], P, N, a.steps, 8, 128,
                                           N * a.steps * 8 * 128)) + "\n".join(lines) + "\n"
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(results, f, indent=2)
    with open(os.path.join(a.out, "results.md"), "w") as f:
        f.write(md)
    print(md)
    runs = [base] + [os.path.join(a.out, "h%s" % h, "island_0") for h in a.hs.split(",")]
    subprocess.run([a.loom, "report"] + runs + ["--out", os.path.join(a.out, "report.html")],
                   check=False, cwd=ROOT)


if __name__ == "__main__":
    sys.exit(main())
