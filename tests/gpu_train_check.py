#!/usr/bin/env python3
"""loom train on the GPU (label gpu; scripts/gpu_check.sh runs it on a GPU machine):

  1. the quickstart model (configs/quickstart.toml) trained 1200 steps on the GPU ends within 1% of
     the CPU run's validation loss, on the same data (pseudo-English text: the GPU machine cannot
     fetch the quickstart corpus);
  2. a GPU run killed with SIGKILL after a checkpoint and resumed with --resume auto logs losses
     bit-identical to an uninterrupted GPU run (f32 and bf16);
  3. a GPU checkpoint resumes on the CPU: the CPU's losses from there stay within 2% of the GPU's;
  4. loom sample, greedy, on the GPU writes the CPU's text (f32 run: the same argmax at each step);
  5. loom islands (two DiLoCo islands, sync rounds) on the GPU ends within 2% of the same islands'
     validation loss on the CPU.

Prints one line per check and a JSON summary on its last line; exits 1 when a check fails.

    gpu_train_check.py LOOM_BINARY SOURCE_DIR
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from procs import kill_when  # noqa: E402
from textdata import write_pseudo_english  # noqa: E402

LOOM, SRC = sys.argv[1], sys.argv[2]
failures = 0
summary = {}


def train(config, run, sets, extra=(), wait=True):
    a = [LOOM, "train", os.path.join(SRC, "configs", config), "--run-dir", run]
    for s in sets:
        a += ["--set", s]
    a += list(extra)
    if not wait:
        return subprocess.Popen(a, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    t0 = time.time()
    r = subprocess.run(a, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit("loom train %s exited %d: %s" % (run, r.returncode, r.stderr[-2000:]))
    return time.time() - t0


def metrics(run):
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def val_loss(run):
    return [m["val_loss"] for m in metrics(run) if m.get("val_loss") is not None][-1]


with tempfile.TemporaryDirectory() as d:
    data = os.path.join(d, "text.txt")
    write_pseudo_english(data, n_words=200000)

    # 1. the quickstart model, 1200 steps, on each device
    vals, secs = {}, {}
    for dev in ["cuda", "cpu"]:
        run = os.path.join(d, "quick-" + dev)
        secs[dev] = train("quickstart.toml", run, ["data.path=" + data, "train.device=" + dev])
        vals[dev] = val_loss(run)
    gap = abs(vals["cuda"] - vals["cpu"]) / vals["cpu"]
    ok = gap <= 0.01
    failures += not ok
    print("%-4s quickstart 1200 steps: val loss cuda %.4f cpu %.4f (gap %.2f%%); %.0f s vs %.0f s"
          % ("ok" if ok else "FAIL", vals["cuda"], vals["cpu"], 100 * gap, secs["cuda"], secs["cpu"]))
    summary["quickstart"] = {"val_loss_cuda": vals["cuda"], "val_loss_cpu": vals["cpu"],
                             "seconds_cuda": secs["cuda"], "seconds_cpu": secs["cpu"]}

    # 2. killed and resumed on the GPU: bit-identical losses
    for dtype in ["f32", "bf16"]:
        sets = ["data.path=" + data, "train.device=cuda", "model.dtype=" + dtype,
                "train.steps=200", "train.warmup_steps=10", "train.eval_every=50",
                "checkpoint.every=10", "checkpoint.keep=2", "optim.lr=2e-3"]
        straight, resumed = os.path.join(d, "a" + dtype), os.path.join(d, "b" + dtype)
        train("tiny-llama.toml", straight, sets)
        p = train("tiny-llama.toml", resumed, sets, wait=False)
        rc = kill_when(p, os.path.join(resumed, "checkpoints", "step_00000010"))
        killed_at = len(metrics(resumed))
        train("tiny-llama.toml", resumed, sets, ["--resume", "auto"])
        a = [(m["step"], m["loss"], m.get("val_loss")) for m in metrics(straight)]
        b = [(m["step"], m["loss"], m.get("val_loss")) for m in metrics(resumed)]
        ok = a == b and rc == -signal.SIGKILL
        failures += not ok
        print("%-4s resume %s on the GPU: killed (rc %d) after %d logged steps; %d steps, losses %s"
              % ("ok" if ok else "FAIL", dtype, rc, killed_at, len(b),
                 "bit-identical" if a == b else "DIFFER"))

    # 3. a GPU checkpoint (bf16 run, step 100) resumed on the CPU
    sets = ["data.path=" + data, "model.dtype=bf16", "train.steps=200", "train.warmup_steps=10",
            "train.eval_every=50", "checkpoint.every=100", "checkpoint.keep=3", "optim.lr=2e-3"]
    gpu_run, cpu_run = os.path.join(d, "g"), os.path.join(d, "c")
    train("tiny-llama.toml", gpu_run, sets + ["train.device=cuda"])
    shutil.copytree(gpu_run, cpu_run)
    shutil.rmtree(os.path.join(cpu_run, "checkpoints", "step_00000200"))
    train("tiny-llama.toml", cpu_run, sets + ["train.device=cpu"], ["--resume", "auto"])
    g = {m["step"]: m["loss"] for m in metrics(gpu_run)}
    c = {m["step"]: m["loss"] for m in metrics(cpu_run)}
    worst = max(abs(c[s] - g[s]) / abs(g[s]) for s in range(101, 201))
    ok = worst <= 0.02 and len(c) == 200
    failures += not ok
    print("%-4s GPU checkpoint (step 100) resumed on the CPU: %d steps, worst loss gap %.3f%%"
          % ("ok" if ok else "FAIL", len(c), 100 * worst))
    summary["gpu_to_cpu_worst_loss_gap"] = worst

    # 4. greedy sampling of the f32 GPU run (2.'s "af32") on each device
    texts = {}
    for dev in ["cuda", "cpu"]:
        r = subprocess.run([LOOM, "sample", os.path.join(d, "af32"), "--prompt", "the ",
                            "--max-tokens", "64", "--temperature", "0", "--device", dev],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit("loom sample --device %s exited %d: %s"
                             % (dev, r.returncode, r.stderr[-2000:]))
        texts[dev] = r.stdout
    ok = texts["cuda"] == texts["cpu"] and len(texts["cpu"]) > 0
    failures += not ok
    print("%-4s loom sample greedy, 64 tokens: the GPU's text %s the CPU's: %r"
          % ("ok" if ok else "FAIL", "equals" if ok else "DIFFERS from", texts["cuda"][:80]))

    # 5. two islands and their outer server, on each device
    isl = {}
    for dev in ["cuda", "cpu"]:
        run = os.path.join(d, "islands-" + dev)
        a = [LOOM, "islands", os.path.join(SRC, "configs", "tiny-llama.toml"), "--islands", "2",
             "--run-dir", run]
        for x in ["data.path=" + data, "train.steps=40", "train.eval_every=0",
                  "outer.inner_steps=10", "outer.mode=sync", "train.device=" + dev]:
            a += ["--set", x]
        r = subprocess.run(a, capture_output=True, text=True,
                           env=dict(os.environ, OMP_WAIT_POLICY="passive"))
        if r.returncode != 0:
            raise SystemExit("loom islands on %s exited %d: %s" % (dev, r.returncode,
                                                                  r.stderr[-2000:]))
        with open(os.path.join(run, "summary.json")) as f:
            isl[dev] = json.load(f)["val_loss"]
    gap = abs(isl["cuda"] - isl["cpu"]) / isl["cpu"]
    ok = gap <= 0.02
    failures += not ok
    print("%-4s loom islands, 2 islands x 40 steps (4 rounds): val loss cuda %.4f cpu %.4f (%.2f%%)"
          % ("ok" if ok else "FAIL", isl["cuda"], isl["cpu"], 100 * gap))
    summary["islands_val_loss"] = isl

print(json.dumps(summary))
sys.exit(1 if failures else 0)
