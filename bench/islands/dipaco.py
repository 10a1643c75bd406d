#!/usr/bin/env python3
"""DiPaCo against one dense model of the same size, at equal steps and tokens (issue 16).

    bench/islands/dipaco.py [--loom build/release/tools/loom/loom] [--out runs/dipaco]
        [--config bench/diloco/diloco.toml] [--modules 2,2] [--base-steps 300] [--steps 1500]
        [--h 30] [--lr 1.0] [--momentum 0.5] [--batch 8]

1. base: the dense model trained alone for --base-steps (one process, batch 4 x --batch), the
   starting point of every run below and the router's feature model;
2. `loom dipaco route`: the corpus's training documents (512 tokens), every 20th held out, the rest
   clustered into the paths of --modules by the base model's features of their first 32 tokens;
3. dipaco: one island per path, each --steps inner steps of batch --batch on its path's documents,
   H = --h, outer Nesterov (--lr, --momentum) per module;
4. dense-diloco: as many islands training the one dense model on every path's documents together
   (ROUTER/all; the same islands, steps, batch, H and outer optimizer: equal steps, tokens and
   communication);
5. dense-dp: the dense model in one process on ROUTER/all with the islands' batches together
   (batch islands x --batch), --steps steps: the same tokens with no communication at all;
6. `loom dipaco eval`: the held-out training documents (the training distribution) and the
   validation book's (a book no model trained on), each routed by its first tokens and scored by
   its path, by every path (the mean path, the oracle best), and by each dense model.
The base model trained on the whole training split, held-out documents included: every run starts
from it, so none gains by it over another.

Prints one JSON line per run and the comparison; writes OUT/results.json.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

from runs import ROOT, add_run_args, island_env, last_checkpoint, run_islands, timed


def main():
    ap = argparse.ArgumentParser()
    add_run_args(ap, "dipaco")
    ap.add_argument("--modules", default="2,2")
    ap.add_argument("--base-steps", type=int, default=300)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--h", type=int, default=30)
    ap.add_argument("--lr", type=float, default=1.0)
    ap.add_argument("--momentum", type=float, default=0.5)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prefix", type=int, default=32, help="tokens the router's features read")
    ap.add_argument("--doc-tokens", type=int, default=512)
    ap.add_argument("--set", action="append", default=[], help="a config override for every run")
    a = ap.parse_args()
    shutil.rmtree(a.out, ignore_errors=True)
    os.makedirs(a.out)
    env = island_env()
    modules = [int(m) for m in a.modules.split(",")]
    paths = 1
    for m in modules:
        paths *= m
    common = [f"data.path={a.data}", "train.eval_batches=16", "checkpoint.every=0"] + a.set
    outer = [f"outer.inner_steps={a.h}", f"outer.lr={a.lr}", f"outer.momentum={a.momentum}",
             f"train.steps={a.steps}", f"train.batch_size={a.batch}"]
    sets = lambda xs: [y for x in xs for y in ("--set", x)]
    rows = []

    def record(row):
        rows.append(row)
        print(json.dumps(row), flush=True)

    base = os.path.join(a.out, "base")
    wall = timed([a.loom, "train", a.config, "--run-dir", base] +
                 sets(common + [f"train.steps={a.base_steps}",
                                f"train.batch_size={paths * a.batch}"]),
                 dict(env, OMP_NUM_THREADS="2"), quiet=True)
    record({"run": "base", "steps": a.base_steps, "wall_s": round(wall, 1)})
    init = last_checkpoint(base)
    router = os.path.join(a.out, "router")
    route = subprocess.run([a.loom, "dipaco", "route", a.config, "--base", base, "--out", router,
                            "--prefix", str(a.prefix), "--doc-tokens", str(a.doc_tokens)] +
                           sets(common + ["outer.modules=[%s]" % a.modules]),
                           check=True, env=env, cwd=ROOT, capture_output=True, text=True)
    record({"run": "route", "paths": [json.loads(l) for l in route.stdout.splitlines()]})

    s = run_islands(a.loom, a.config, os.path.join(a.out, "dipaco"), paths,
                    common + outer + [f"model.init={init}", "outer.modules=[%s]" % a.modules,
                                      f"outer.router={router}"], env=env, quiet=True)
    record({"run": "dipaco", "islands": paths, "rounds": s["version"],
            "per_path": s["per_path"], "wall_s": round(s["wall_s"], 1),
            "parameters": s["parameters"], "table_parameters": s.get("table_parameters"),
            "bytes": s["bytes_sent"] + s["bytes_received"]})
    alldata = [f"data.path={os.path.join(router, 'all')}"]
    d = run_islands(a.loom, a.config, os.path.join(a.out, "dense-diloco"), paths,
                    common + outer + [f"model.init={init}"] + alldata, env=env, quiet=True)
    record({"run": "dense-diloco", "islands": paths, "rounds": d["version"],
            "val_loss": d["val_loss"], "wall_s": round(d["wall_s"], 1),
            "bytes": d["bytes_sent"] + d["bytes_received"], "parameters": d["parameters"]})
    dp = os.path.join(a.out, "dense-dp")
    wall = timed([a.loom, "train", a.config, "--run-dir", dp] +
                 sets(common + alldata + [f"model.init={init}", f"train.steps={a.steps}",
                                          f"train.batch_size={paths * a.batch}"]),
                 dict(env, OMP_NUM_THREADS="2"), quiet=True)
    record({"run": "dense-dp", "steps": a.steps, "wall_s": round(wall, 1)})

    scores = {}
    for name, dense in [("dense-diloco", os.path.join(a.out, "dense-diloco", "server")),
                        ("dense-dp", dp)]:
        ev = subprocess.run([a.loom, "dipaco", "eval", os.path.join(a.out, "dipaco"),
                             "--dense", dense], check=True, env=env, cwd=ROOT,
                            capture_output=True, text=True)
        scores[name] = json.loads(ev.stdout)
    for which in ("heldout", "val"):
        e = scores["dense-diloco"][which]
        dp_loss = scores["dense-dp"][which]["dense_loss"]
        result = {"run": "eval-" + which, "docs": e["docs"], "routed_loss": e["routed_loss"],
                  "mean_path_loss": e["mean_path_loss"], "best_path_loss": e["best_path_loss"],
                  "routed_beats_mean_path": e["routed_beats_mean_path"],
                  "dense_diloco_loss": e["dense_loss"], "dense_dp_loss": dp_loss,
                  "per_path": e["per_path"],
                  "routed_vs_dense_diloco_pct": round(100 * (e["routed_loss"] / e["dense_loss"] - 1), 2),
                  "routed_vs_dense_dp_pct": round(100 * (e["routed_loss"] / dp_loss - 1), 2)}
        record(result)
        print("%s: routed paths %.4f | mean path %.4f | best path %.4f | dense DiLoCo %.4f | dense DP"
              " %.4f | routed beats the mean path on %.0f%% of %d documents" % (
                  which, e["routed_loss"], e["mean_path_loss"], e["best_path_loss"],
                  e["dense_loss"], dp_loss, 100 * e["routed_beats_mean_path"], e["docs"]),
              flush=True)
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(rows, f, indent=2)


if __name__ == "__main__":
    sys.exit(main())
