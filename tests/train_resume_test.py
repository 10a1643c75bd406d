#!/usr/bin/env python3
"""loom train, killed with SIGKILL after its first checkpoint and resumed with --resume auto, logs
bit-identical losses at every step to a run that was never interrupted (f32 and bf16).

    train_resume_test.py LOOM_BINARY SOURCE_DIR
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

from textdata import write_pseudo_english

LOOM, SRC = sys.argv[1], sys.argv[2]
CONFIG = os.path.join(SRC, "configs", "tiny-llama.toml")
failures = 0


def args(run, dtype, data):
    return [LOOM, "train", CONFIG, "--run-dir", run, "--set", "model.dtype=" + dtype,
            "--set", "data.path=" + data, "--set", "train.steps=200", "--set", "train.warmup_steps=10",
            "--set", "train.eval_every=50", "--set", "checkpoint.every=10",
            "--set", "checkpoint.keep=2", "--set", "optim.lr=2e-3"]


def losses(run):
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return [(j["step"], j["loss"], j.get("val_loss")) for j in map(json.loads, f)]


with tempfile.TemporaryDirectory() as d:
    data = os.path.join(d, "text.txt")
    write_pseudo_english(data)
    env = dict(os.environ, OMP_NUM_THREADS="2")
    for dtype in ["f32", "bf16"]:
        straight, resumed = os.path.join(d, "a" + dtype), os.path.join(d, "b" + dtype)
        subprocess.run(args(straight, dtype, data), check=True, env=env, capture_output=True)
        p = subprocess.Popen(args(resumed, dtype, data), env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        first = os.path.join(resumed, "checkpoints", "step_00000010")
        deadline = time.time() + 120
        while not os.path.exists(first) and p.poll() is None and time.time() < deadline:
            time.sleep(0.001)
        p.send_signal(signal.SIGKILL)
        rc = p.wait()
        killed_at = len(losses(resumed))
        if rc != -signal.SIGKILL:
            print("FAIL %s: the run was not killed mid-way (rc %d)" % (dtype, rc))
            failures += 1
            continue
        r = subprocess.run(args(resumed, dtype, data) + ["--resume", "auto"], env=env,
                           capture_output=True, text=True)
        if r.returncode != 0:
            print("FAIL %s: resume exited %d: %s" % (dtype, r.returncode, r.stderr))
            failures += 1
            continue
        a, b = losses(straight), losses(resumed)
        same = a == b
        print("%-4s %s: killed after %d logged steps, resumed; %d steps, losses %s (first %.4f, "
              "last %.4f)" % ("ok" if same else "FAIL", dtype, killed_at, len(b),
                              "bit-identical" if same else "DIFFER", a[0][1], a[-1][1]))
        if not same:
            failures += 1
            for x, y in zip(a, b):
                if x != y:
                    print("     first difference: straight %s resumed %s" % (x, y))
                    break
print("train resume: all exact" if not failures else "train resume: %d FAILED" % failures)
sys.exit(1 if failures else 0)
