#!/usr/bin/env python3
"""loom train, killed with SIGKILL after its first checkpoint and resumed with --resume auto, logs
bit-identical losses at every step to a run that was never interrupted (f32 and bf16; and in f32
with its checkpoints written asynchronously, `[checkpoint] async`). A damaged
newest checkpoint (one flipped bit in either tensor file, a changed state.json or config.toml) is
refused naming the file (and the tensor), and --resume auto falls back to the checkpoint before it,
saying so, with losses still bit-identical; with every checkpoint damaged it exits 1 naming each.
The run directory: a second `loom train` on a directory in use stops at once naming the process
that holds it; a metrics write that fails (the file-size limit: EFBIG, as a full disk gives
ENOSPC) ends the run with exit 1 naming metrics.jsonl; --resume auto keeps a metrics line it
cannot parse rather than dropping it and everything after it.

    train_resume_test.py LOOM_BINARY SOURCE_DIR
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

from procs import kill_when
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
    # the resumed run writes its checkpoints at once, or asynchronously ([checkpoint] async)
    for dtype, mode in [("f32", "false"), ("bf16", "false"), ("f32", "true")]:
        name = dtype + (" async" if mode == "true" else "")
        straight, resumed = os.path.join(d, "a" + dtype), os.path.join(d, "b" + dtype + mode)
        if not os.path.isdir(straight):
            subprocess.run(args(straight, dtype, data), check=True, env=env, capture_output=True)
        resumed_args = args(resumed, dtype, data) + ["--set", "checkpoint.async=" + mode]
        p = subprocess.Popen(resumed_args, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        rc = kill_when(p, os.path.join(resumed, "checkpoints", "step_00000010"))
        killed_at = len(losses(resumed))
        if rc != -signal.SIGKILL:
            print("FAIL %s: the run was not killed mid-way (rc %d)" % (name, rc))
            failures += 1
            continue
        r = subprocess.run(resumed_args + ["--resume", "auto"], env=env,
                           capture_output=True, text=True)
        if r.returncode != 0:
            print("FAIL %s: resume exited %d: %s" % (name, r.returncode, r.stderr))
            failures += 1
            continue
        a, b = losses(straight), losses(resumed)
        same = a == b
        print("%-4s %s: killed after %d logged steps, resumed; %d steps, losses %s (first %.4f, "
              "last %.4f)" % ("ok" if same else "FAIL", name, killed_at, len(b),
                              "bit-identical" if same else "DIFFER", a[0][1], a[-1][1]))
        if not same:
            failures += 1
            for x, y in zip(a, b):
                if x != y:
                    print("     first difference: straight %s resumed %s" % (x, y))
                    break


def flip(path, at):
    """Flips one bit of the byte at offset `at` (negative: from the end)."""
    with open(path, "r+b") as f:
        f.seek(at, os.SEEK_SET if at >= 0 else os.SEEK_END)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0x10]))


def tensor_data_start(path):
    with open(path, "rb") as f:
        return 8 + int.from_bytes(f.read(8), "little")


with tempfile.TemporaryDirectory() as d:
    data = os.path.join(d, "text.txt")
    write_pseudo_english(data)
    env = dict(os.environ, OMP_NUM_THREADS="2")

    def run_args(run, steps):
        a = args(run, "f32", data)
        a[a.index("train.steps=200")] = "train.steps=%d" % steps
        return a

    straight = os.path.join(d, "straight")
    subprocess.run(run_args(straight, 40), check=True, env=env, capture_output=True)
    # (file, offset of the flipped byte, what the error must name)
    damages = [("model.safetensors", "data", "fails the checksum"),
               ("optimizer.safetensors", "data", "fails the checksum"),
               ("state.json", "text.txt", "state.json fails its checksum"),
               ("config.toml", 10, "config.toml fails the checksum")]
    for name, where, needle in damages:
        run = os.path.join(d, "damaged-" + name)
        subprocess.run(run_args(run, 40), check=True, env=env, capture_output=True)
        newest = os.path.join(run, "checkpoints", "step_00000040")
        path = os.path.join(newest, name)
        if where == "data":
            at = tensor_data_start(path) + 4096
        elif isinstance(where, str):  # a letter inside a JSON string: still JSON, not the same
            at = open(path, "rb").read().index(where.encode())
        else:
            at = where
        flip(path, at)
        r = subprocess.run(run_args(run, 40) + ["--resume", "auto"], env=env, capture_output=True,
                           text=True)
        named = needle in r.stderr and path in r.stderr and "step_00000030" in r.stderr \
            and "trying the checkpoint before it" in r.stderr
        if name.endswith(".safetensors"):
            named = named and "tensor '" in r.stderr
        same = r.returncode == 0 and losses(run) == losses(straight)
        ok = named and same
        print("%-4s damaged %s: %s; losses %s" % (
            "ok" if ok else "FAIL", name, "refused and fell back to step 30" if named else
            "not reported as asked: " + r.stderr[-800:], "bit-identical" if same else "DIFFER"))
        failures += 0 if ok else 1
    # an older checkpoint (no checksums) whose state.json names another step: refused, fallen back
    run = os.path.join(d, "wrong-step")
    subprocess.run(run_args(run, 40), check=True, env=env, capture_output=True)
    state = os.path.join(run, "checkpoints", "step_00000040", "state.json")
    st = json.load(open(state))
    del st["crc32"]
    st["step"] = 2 ** 63 - 1
    json.dump(st, open(state, "w"))
    r = subprocess.run(run_args(run, 40) + ["--resume", "auto"], env=env, capture_output=True,
                       text=True)
    ok = r.returncode == 0 and "is not its directory's (40)" in r.stderr \
        and losses(run) == losses(straight)
    print("%-4s state.json's step 2^63-1 in step_00000040: refused, fell back, losses %s" % (
        "ok" if ok else "FAIL", "bit-identical" if ok else "?: " + r.stderr[-500:]))
    failures += 0 if ok else 1
    # every checkpoint damaged: exit 1 naming each, nothing deleted
    run = os.path.join(d, "damaged-all")
    subprocess.run(run_args(run, 40), check=True, env=env, capture_output=True)
    ckpts = sorted(os.listdir(os.path.join(run, "checkpoints")))
    for c in ckpts:
        p = os.path.join(run, "checkpoints", c, "model.safetensors")
        flip(p, tensor_data_start(p) + 100)
    r = subprocess.run(run_args(run, 40) + ["--resume", "auto"], env=env, capture_output=True,
                       text=True)
    ok = r.returncode == 1 and "no checkpoint can be resumed from" in r.stderr \
        and all(c in r.stderr for c in ckpts) \
        and sorted(os.listdir(os.path.join(run, "checkpoints"))) == ckpts
    print("%-4s every checkpoint damaged: exit %d, %s" % ("ok" if ok else "FAIL", r.returncode,
                                                          r.stderr.strip().splitlines()[-1:]))
    failures += 0 if ok else 1

with tempfile.TemporaryDirectory() as d:
    data = os.path.join(d, "text.txt")
    write_pseudo_english(data)
    env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="passive")

    def run_args(run, steps, *extra):
        a = args(run, "f32", data) + list(extra)
        a[a.index("train.steps=200")] = "train.steps=%d" % steps
        return a

    # a directory in use: the second run stops before touching it
    run = os.path.join(d, "busy")
    first = subprocess.Popen(run_args(run, 100000, "--set", "checkpoint.every=1000000"), env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics = os.path.join(run, "metrics.jsonl")
    deadline = time.time() + 60
    while time.time() < deadline and not (os.path.exists(metrics) and os.path.getsize(metrics)):
        time.sleep(0.01)
    before = open(metrics).read() if os.path.exists(metrics) else ""
    r = subprocess.run(run_args(run, 10), env=env, capture_output=True, text=True, timeout=120)
    r2 = subprocess.run(run_args(run, 10, "--resume", "auto"), env=env, capture_output=True,
                        text=True, timeout=120)
    first.kill()
    first.wait()
    after = open(metrics).read()
    ok = all(x.returncode == 1 and "is in use" in x.stderr and "pid %d" % first.pid in x.stderr
             for x in (r, r2)) and after.startswith(before) and len(after) > 0
    print("%-4s a run dir in use: a second loom train (fresh, and --resume auto) exits 1 naming "
          "pid %d; the first's metrics untouched" % ("ok" if ok else "FAIL", first.pid))
    if not ok:
        print("     " + r.stderr[-500:] + " | " + r2.stderr[-500:])
    failures += 0 if ok else 1
    # once it is gone, the lock goes with it
    r = subprocess.run(run_args(os.path.join(d, "busy2"), 2), env=env, capture_output=True,
                       text=True)
    r = subprocess.run(run_args(os.path.join(d, "busy2"), 4, "--resume", "auto"), env=env,
                       capture_output=True, text=True)
    ok = r.returncode == 0
    print("%-4s the lock is released with its run: a later --resume auto runs" % ("ok" if ok else
                                                                                  "FAIL"))
    failures += 0 if ok else 1

    # a metrics write that fails ends the run (EFBIG from the file-size limit)
    import resource

    def limited():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (3000, 3000))

    run = os.path.join(d, "full")
    r = subprocess.run(run_args(run, 200, "--set", "checkpoint.every=1000000"), env=env,
                       capture_output=True, text=True, preexec_fn=limited)
    lines = open(os.path.join(run, "metrics.jsonl")).read().split("\n")
    whole = [json.loads(x) for x in lines[:-1]]
    ok = r.returncode == 1 and "metrics.jsonl" in r.stderr and "EFBIG" in r.stderr \
        and 5 <= len(whole) < 200 and [m["step"] for m in whole] == list(range(1, len(whole) + 1))
    print("%-4s a failed metrics write: exit %d after %d whole lines, naming the file and error" % (
        "ok" if ok else "FAIL", r.returncode, len(whole)))
    if not ok:
        print("     " + r.stderr[-600:])
    failures += 0 if ok else 1

    # --resume auto keeps what it cannot parse
    run = os.path.join(d, "garbled")
    subprocess.run(run_args(run, 20), check=True, env=env, capture_output=True)
    path = os.path.join(run, "metrics.jsonl")
    rows = open(path).read().splitlines()
    rows.insert(5, "this is not json")
    open(path, "w").write("\n".join(rows) + "\n")
    r = subprocess.run(run_args(run, 30, "--resume", "auto"), env=env, capture_output=True,
                       text=True)
    rows = open(path).read().splitlines()
    steps = [json.loads(x)["step"] for x in rows if x != "this is not json"]
    ok = r.returncode == 0 and "this is not json" in rows and "kept 1 line" in r.stderr \
        and steps == list(range(1, 31))
    print("%-4s --resume auto keeps an unparsable metrics line and every step around it" % (
        "ok" if ok else "FAIL"))
    if not ok:
        print("     rc %d, steps %s, %s" % (r.returncode, steps[:8], r.stderr[-400:]))
    failures += 0 if ok else 1
print("train resume: all exact" if not failures else "train resume: %d FAILED" % failures)
sys.exit(1 if failures else 0)
