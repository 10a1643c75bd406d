#!/usr/bin/env python3
"""Mixture-of-Experts through the CLI as a user runs it: `loom train` on tiny-moe (one process, and
under mpirun with the `expert` tactic on 2 ranks) logs the objective (`loss`), the cross-entropy
(`ce_loss`) and the router's load every step; the two runs log the same losses; `loom report` draws
the load; bad [model] moe keys are refused naming the key.

    moe_test.py LOOM_BINARY SOURCE_DIR

Uses only the standard library.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checks import Checks, run_ok  # noqa: E402

LOOM, SRC = sys.argv[1], sys.argv[2]
CFG = os.path.join(SRC, "configs", "tiny-moe.toml")
c = Checks()
env = dict(os.environ, OMP_WAIT_POLICY="passive", OMP_NUM_THREADS="1")


def metrics(run):
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


with tempfile.TemporaryDirectory() as tmp:
    data = os.path.join(tmp, "text.txt")
    with open(data, "w") as f:
        for i in range(400):
            f.write("the %d-th line of a small corpus, with words that repeat and repeat.\n" % i)
    common = ["--set", "data.path=" + data, "--set", "train.steps=12", "--set", "train.eval_every=6",
              "--set", "train.seq_len=32"]
    one = os.path.join(tmp, "one")
    run_ok([LOOM, "train", CFG, "--run-dir", one] + common, env=env)
    rows = metrics(one)
    c.check("12 steps logged", len(rows) == 12, str(len(rows)))
    keys = ("ce_loss", "moe_tokens_max", "moe_tokens_mean", "moe_dropped")
    c.check("every step has the MoE metrics", all(all(k in r for k in keys) for r in rows))
    # the objective adds aux_loss * balance (>= top_k = 2 at best) and z_loss * z >= 0
    c.check("loss > ce_loss (the auxiliary losses are added)",
            all(r["loss"] - r["ce_loss"] > 0.01 * 1.99 for r in rows),
            str([(r["loss"], r["ce_loss"]) for r in rows[:3]]))
    # 4 sequences x 32 tokens x top 2 over 4 experts: mean kept <= 64, capacity 20 per sequence
    c.check("load within capacity", all(r["moe_tokens_max"] <= 4 * 20 for r in rows),
            str([r["moe_tokens_max"] for r in rows]))
    c.check("kept + dropped = every choice",
            all(abs(r["moe_tokens_mean"] * 2 * 4 + r["moe_dropped"] - 2 * 4 * 32 * 2) < 1e-6
                for r in rows),
            str([(r["moe_tokens_mean"], r["moe_dropped"]) for r in rows[:3]]))

    r = subprocess.run([LOOM, "report", one], capture_output=True, text=True, env=env)
    page = open(os.path.join(one, "report.html")).read() if r.returncode == 0 else ""
    c.check("loom report draws the router load", "router load" in page and "train cross-entropy"
            in page, r.stderr[-500:])

    mpirun = shutil.which("mpirun")
    c.check("mpirun is installed", mpirun is not None)
    if mpirun:
        two = os.path.join(tmp, "two")
        run_ok([mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2", "-x",
                "OMP_WAIT_POLICY", "-x", "OMP_NUM_THREADS", LOOM, "train", CFG, "--run-dir", two,
                "--set", "plan.mesh={expert=2}", "--set",
                'plan.tactics=[{kind="expert",axis="expert"}]'] + common, env=env)
        rows2 = metrics(two)
        worst = max(abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(rows2, rows))
        c.check("expert on 2 ranks logs the one-process losses (rel 1e-5)",
                len(rows2) == len(rows) and worst <= 1e-5, "worst %.3g" % worst)
        c.check("and the same router load",
                [r["moe_dropped"] for r in rows2] == [r["moe_dropped"] for r in rows])

    for moe, want in [("{experts=-1}", "moe.experts"), ("{experts=4,top_k=5}", "moe.top_k"),
                      ("{experts=4,capacity_factor=0.0}", "moe.capacity_factor"),
                      ("{experts=4,every=3}", "moe.every"),
                      ('{experts=4,balance="token"}', "moe.balance"),
                      ("{experts=4,bogus=1}", "unknown key 'bogus'"), ("4", "expected a table")]:
        r = subprocess.run([LOOM, "train", CFG, "--set", "model.moe=" + moe, "--run-dir",
                            os.path.join(tmp, "bad")] + common, capture_output=True, text=True,
                           env=env)
        c.check("[model] moe = %s refused naming %s" % (moe, want),
                r.returncode == 1 and want in r.stderr, r.stderr[-300:])
c.finish()
