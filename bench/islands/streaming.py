#!/usr/bin/env python3
"""Streaming DiLoCo against plain DiLoCo (issue 16): the same islands, data, H and outer optimizer;
the model's fragments synced at staggered offsets, 4-bit pushes, an overlap with mixing.

configs/tiny-llama.toml with 4 layers (217,664 parameters; 4 fragments need 4 layers), byte-level
on the default Gutenberg text, 4 islands of batch 4 x 64 tokens, H = 32 (one fragment every 8 steps
with 4 fragments), outer lr 1.0 and momentum 0.5 (the best of the H = 30 sweep in
docs/benchmarks.md#diloco), --steps 3200 (100 rounds of each fragment), every run over --seeds.
Validation loss: the server's final global parameters on 16 held-out batches (loom islands).

    bench/islands/streaming.py [--loom build/release/tools/loom/loom] [--out runs/streaming]
        [--steps 3200] [--seeds 1,2,3] [--outer 1.0:0.5,0.8:0.7] [--variants plain,f4-int4]

Bytes: what the islands sent and received, measured; peak: the most one island moved in one
fragment round (its push and its pull; the final flush, which takes every fragment, left out).
Prints one JSON line per run, then for each outer setting each variant's median over the seeds and
the median over seeds of its loss against plain DiLoCo's of the same seed and setting.
"""
import argparse
import json
import os
import shutil
import statistics
import sys

from runs import LOOM, ROOT, island_env, run_islands

CONFIG = os.path.join(ROOT, "configs/tiny-llama.toml")
N, H = 4, 32
VARIANTS = [  # name, [outer] settings beyond plain DiLoCo's
    ("plain", []),
    ("int4", ["outer.compress=\"int4\""]),
    ("f4", ["outer.fragments=4"]),
    ("f4-int4", ["outer.fragments=4", "outer.compress=\"int4\""]),
    ("f4-int4-tau2-mix0.5", ["outer.fragments=4", "outer.compress=\"int4\"", "outer.overlap=2",
                             "outer.mix=0.5"]),
    ("f4-int4-tau2-mix0", ["outer.fragments=4", "outer.compress=\"int4\"", "outer.overlap=2"]),
    ("f4-int4-tau1-mix0.5", ["outer.fragments=4", "outer.compress=\"int4\"", "outer.overlap=1",
                             "outer.mix=0.5"]),
    ("f4-int4-tau1-mix0", ["outer.fragments=4", "outer.compress=\"int4\"", "outer.overlap=1"]),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loom", default=LOOM)
    ap.add_argument("--out", default=os.path.join(ROOT, "runs/streaming"))
    ap.add_argument("--steps", type=int, default=3200)
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--outer", default="1.0:0.5", help="outer lr:momentum settings, comma-separated")
    ap.add_argument("--variants", default=",".join(v[0] for v in VARIANTS))
    a = ap.parse_args()
    variants = [v for v in VARIANTS if v[0] in a.variants.split(",")]
    if not variants or variants[0][0] != "plain":
        sys.exit("streaming.py: --variants must include plain (the baseline)")
    outers = [tuple(float(x) for x in o.split(":")) for o in a.outer.split(",")]
    shutil.rmtree(a.out, ignore_errors=True)
    os.makedirs(a.out)
    env = island_env()
    common = ["model.n_layers=4", "data.path=" + os.path.join(ROOT, "data/gutenberg"),
              "train.eval_batches=16", "train.warmup_steps=100", f"train.steps={a.steps}",
              f"outer.inner_steps={H}"]
    rows = []
    for seed, (lr, mom), (name, sets) in [(s, o, v) for s in [int(x) for x in a.seeds.split(",")]
                                          for o in outers for v in variants]:
            s = run_islands(a.loom, CONFIG, os.path.join(a.out, f"{name}-lr{lr}-m{mom}-s{seed}"), N,
                            common + [f"train.seed={seed}", f"outer.lr={lr}",
                                      f"outer.momentum={mom}"] + sets, env=env, quiet=True)
            row = {"run": name, "outer_lr": lr, "outer_momentum": mom, "seed": seed,
                   "val_loss": s["val_loss"], "version": s["version"],
                   "parameters": s["parameters"], "bytes": s["bytes_sent"] + s["bytes_received"],
                   "bytes_sent": s["bytes_sent"], "peak_round_bytes": s["peak_round_bytes"],
                   "wall_s": round(s["wall_s"], 1)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    summary = []
    for lr, mom in outers:
        at = [r for r in rows if (r["outer_lr"], r["outer_momentum"]) == (lr, mom)]
        plain = {r["seed"]: r for r in at if r["run"] == "plain"}
        for name, _ in variants:
            mine = [r for r in at if r["run"] == name]
            vs = [100 * (r["val_loss"] / plain[r["seed"]]["val_loss"] - 1) for r in mine]
            p = max(r["peak_round_bytes"] for r in plain.values())
            summary.append({"run": name, "outer_lr": lr, "outer_momentum": mom,
                            "val_loss_median": statistics.median(r["val_loss"] for r in mine),
                            "vs_plain_pct_per_seed": [round(v, 3) for v in vs],
                            "vs_plain_pct_median": round(statistics.median(vs), 3),
                            "peak_round_bytes": max(r["peak_round_bytes"] for r in mine),
                            "peak_lower_x": round(p / max(r["peak_round_bytes"] for r in mine), 2),
                            "bytes_sent": statistics.median(r["bytes_sent"] for r in mine)})
            print(json.dumps(summary[-1]), flush=True)
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump({"runs": rows, "summary": summary}, f, indent=2)
    for s in summary:
        print("lr %.1f m %.1f  %-20s val %.4f  vs plain %+.3f%% (per seed %s)  peak/round %8d B "
              "(%.2fx lower)" % (s["outer_lr"], s["outer_momentum"], s["run"], s["val_loss_median"],
                                 s["vs_plain_pct_median"], s["vs_plain_pct_per_seed"],
                                 s["peak_round_bytes"], s["peak_lower_x"]))


if __name__ == "__main__":
    sys.exit(main())
