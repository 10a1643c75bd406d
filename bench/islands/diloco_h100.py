#!/usr/bin/env python3
"""DiLoCo at H = 100 against data parallelism, each tuned on the same budget and chosen on other
validation batches than those reported (issue 32):

    bench/islands/diloco_h100.py [--loom build/release/tools/loom/loom] [--out runs/diloco_h100]
        [--steps 6200] [--h 100] [--outer 1.0:0.5,0.7:0.5,0.8:0.7] [--dp-lrs 2e-3,4e-3,8e-3]
        [--config bench/diloco/diloco.toml --data data/gutenberg-bpe2048]

DiLoCo: 4 islands of batch 8 (one process and one thread each, `loom islands`), H inner steps a
round, one run per outer (lr, momentum) of --outer. Data parallelism: one process of batch 32 (the
same tokens per step; 2 threads), one run per inner lr of --dp-lrs (DiLoCo's islands keep the
config's). Both take --steps steps of the same schedule. As many settings for each.

Every final model is evaluated the same way, apart from training: `loom train` from it
(`[model] init`) for one step at lr 0, batch 8, 32 held-out batches. The batches depend on
`[train] seed`: each side's best setting is chosen on the batches of seed --select-seed, and the
figures reported are on the batches of the runs' own seed, which took no part in choosing. A
DiLoCo model is island 0's last checkpoint: at the run's last step every island takes the server's
final parameters whole. Prints one JSON line per run and the summary.
"""
import argparse
import json
import os
import shutil
import sys

from runs import add_run_args, island_env, last_checkpoint, last_val, run_islands, timed

N = 4


def final_checkpoint(run_dir):
    """The model of RUN_DIR's last checkpoint."""
    return os.path.join(last_checkpoint(run_dir), "model.safetensors")


def main():
    ap = argparse.ArgumentParser()
    add_run_args(ap, "diloco_h100")
    ap.add_argument("--steps", type=int, default=6200)
    ap.add_argument("--h", type=int, default=100)
    ap.add_argument("--outer", default="1.0:0.5,0.7:0.5,0.8:0.7", help="lr:momentum,...")
    ap.add_argument("--dp-lrs", default="2e-3,4e-3,8e-3")
    ap.add_argument("--seed", type=int, default=0, help="the runs' seed: the batches reported")
    ap.add_argument("--select-seed", type=int, default=1000, help="the batches choosing")
    ap.add_argument("--eval-batches", type=int, default=32)
    a = ap.parse_args()
    outer = [tuple(float(x) for x in s.split(":")) for s in a.outer.split(",")]
    dp_lrs = [float(x) for x in a.dp_lrs.split(",")]
    if len(outer) != len(dp_lrs):
        raise SystemExit("--outer and --dp-lrs: as many settings for each (the same budget)")
    shutil.rmtree(a.out, ignore_errors=True)
    os.makedirs(a.out)
    env = island_env()
    common = ["data.path=" + a.data, f"train.steps={a.steps}", f"train.seed={a.seed}",
              "train.eval_every=0", "checkpoint.every=0"]

    def sets(xs):
        return [y for x in xs for y in ("--set", x)]

    def evaluate(model, seed, name):
        run = os.path.join(a.out, "eval", f"{name}-s{seed}")
        timed([a.loom, "train", a.config, "--run-dir", run] + sets(
            ["data.path=" + a.data, "model.init=" + model, "train.steps=1", f"train.seed={seed}",
             "train.batch_size=8", f"train.eval_batches={a.eval_batches}", "optim.lr=0",
             "train.min_lr=0", "train.warmup_steps=0", "checkpoint.every=0"]),
            dict(env, OMP_NUM_THREADS="2"), quiet=True)
        return last_val(run)

    rows = []

    def record(row, model):
        row["select_val"] = evaluate(model, a.select_seed, row["run"])
        row["val_loss"] = evaluate(model, a.seed, row["run"])
        rows.append(row)
        print(json.dumps(row), flush=True)

    def dp(lr):
        name = f"dp-lr{lr:g}"
        run = os.path.join(a.out, name)
        wall = timed([a.loom, "train", a.config, "--run-dir", run] + sets(
            common + [f"train.batch_size={N * 8}", f"optim.lr={lr}"]),
            dict(env, OMP_NUM_THREADS="2"), quiet=True)
        record({"run": name, "side": "dp", "lr": lr, "own_val": last_val(run),
                "wall_s": round(wall, 1)}, final_checkpoint(run))

    def diloco(lr, mom):
        name = f"h{a.h}-lr{lr:g}-m{mom:g}"
        run = os.path.join(a.out, name)
        s = run_islands(a.loom, a.config, run, N,
                        common + [f"outer.inner_steps={a.h}", f"outer.lr={lr}",
                                  f"outer.momentum={mom}", "outer.mode=sync"], env=env, quiet=True)
        record({"run": name, "side": "diloco", "outer_lr": lr, "outer_momentum": mom,
                "rounds": s["version"], "own_val": s["val_loss"], "wall_s": round(s["wall_s"], 1),
                "bytes": s["bytes_sent"] + s["bytes_received"]},
               final_checkpoint(os.path.join(run, "island_0")))

    # alternated, so that the runs made at any point hold as many settings of each side
    for lr, (olr, mom) in zip(dp_lrs, outer):
        dp(lr)
        diloco(olr, mom)
    best = {side: min((r for r in rows if r["side"] == side), key=lambda r: r["select_val"])
            for side in ("dp", "diloco")}
    summary = {"steps": a.steps, "h": a.h, "settings_each": len(dp_lrs),
               "dp_best": best["dp"]["run"], "diloco_best": best["diloco"]["run"],
               "dp_val": best["dp"]["val_loss"], "diloco_val": best["diloco"]["val_loss"],
               "diloco_vs_dp": round(100 * (best["diloco"]["val_loss"] / best["dp"]["val_loss"]
                                            - 1), 2)}
    print(json.dumps(summary), flush=True)
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump({"runs": rows, "summary": summary}, f, indent=2)


if __name__ == "__main__":
    sys.exit(main())
