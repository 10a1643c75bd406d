#!/usr/bin/env python3
"""Crash safety of loom train's checkpoints.

1. SIGKILL while a checkpoint is being written (its temporary directory exists): the previous
   checkpoint stays loadable, --resume auto picks it, and training completes.
2. A write that fails mid-checkpoint (the file-size limit stands in for a full disk: writes fail with
   EFBIG as they would with ENOSPC): exit 1 with a message naming the checkpoint; the last good
   checkpoint is untouched and a later resume completes.

Both with checkpoints written at once and with `[checkpoint] async = true` (written on a thread
while training goes on).

    checkpoint_crash_test.py LOOM_BINARY SOURCE_DIR
"""
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time

LOOM, SRC = sys.argv[1], sys.argv[2]
failures = 0


def check(ok, what):
    global failures
    print("%-4s %s" % ("ok" if ok else "FAIL", what))
    failures += 0 if ok else 1


with tempfile.TemporaryDirectory() as d:
    data = os.path.join(d, "text.txt")
    with open(data, "w") as f:
        f.write("It was the best of times, it was the worst of times.\n" * 3000)
    env = dict(os.environ, OMP_NUM_THREADS="2", OMP_WAIT_POLICY="passive")

    for mode in ["false", "true"]:
        print("[checkpoint] async = %s" % mode)
        # 1. SIGKILL mid-write: a model big enough (34M parameters: ~400 MB per checkpoint) that a
        # write takes long enough to be caught, trained on tiny batches so steps are quick.
        run = os.path.join(d, "kill" + mode)
        cmd = [LOOM, "train", os.path.join(SRC, "configs", "bench-llama.toml"), "--run-dir", run,
               "--set", "data.path=" + data, "--set", "train.batch_size=1",
               "--set", "train.seq_len=16",
               "--set", "train.steps=3", "--set", "checkpoint.every=1", "--set", "checkpoint.keep=2",
               "--set", "train.eval_batches=1", "--set", "checkpoint.async=" + mode]
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        ck = os.path.join(run, "checkpoints")
        deadline, caught = time.time() + 300, None
        while time.time() < deadline and p.poll() is None:
            names = os.listdir(ck) if os.path.isdir(ck) else []
            tmp = [n for n in names if n.startswith(".tmp.step_00000002")]
            if tmp and "step_00000001" in names:
                p.send_signal(signal.SIGKILL)
                caught = tmp[0]
                break
            time.sleep(0.002)
        p.wait()
        check(caught is not None and p.returncode == -signal.SIGKILL,
              "killed while writing checkpoint 2 (%s)" % caught)
        names = sorted(os.listdir(ck))
        check("step_00000002" not in names,
              "no half checkpoint is visible as step_00000002: %s" % names)
        r = subprocess.run(cmd + ["--resume", "auto"], env=env, capture_output=True, text=True)
        check(r.returncode == 0 and "step_00000001 (step 1)" in r.stderr,
              "--resume auto picks step 1 and completes (rc %d: %s)"
              % (r.returncode, r.stderr.strip()[-200:]))
        names = sorted(os.listdir(ck))
        check(names == ["step_00000002", "step_00000003"],
              "the sweep leaves the newest two: %s" % names)

        # 2. A write failing mid-checkpoint.
        run = os.path.join(d, "full" + mode)
        cmd = [LOOM, "train", os.path.join(SRC, "configs", "tiny-llama.toml"), "--run-dir", run,
               "--set", "data.path=" + data, "--set", "train.steps=4", "--set", "checkpoint.every=2",
               "--set", "checkpoint.async=" + mode]
        r = subprocess.run(cmd + ["--set", "train.steps=2"], env=env, capture_output=True, text=True)
        check(r.returncode == 0, "a first run writes checkpoint 2")
        good = os.path.join(run, "checkpoints", "step_00000002", "model.safetensors")
        before = open(good, "rb").read()

        def small_files():  # 100 KB: the ~500 KB model file cannot be written
            resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))

        r = subprocess.run(cmd + ["--resume", "auto"], env=env, capture_output=True, text=True,
                           preexec_fn=small_files)
        msg = r.stderr.strip()
        check(r.returncode == 1 and "step_00000004" in msg and "File too large" in msg,
              "a failed checkpoint write exits 1 naming it: %s" % msg.splitlines()[0:2])
        names = sorted(os.listdir(os.path.join(run, "checkpoints")))
        check(names == ["step_00000002"],
              "no partial checkpoint or temp directory is left: %s" % names)
        check(open(good, "rb").read() == before, "the last good checkpoint is untouched")
        r = subprocess.run(cmd + ["--resume", "auto"], env=env, capture_output=True, text=True)
        check(r.returncode == 0 and "trained to step 4" in r.stdout, "a later resume completes")

print("checkpoint crash: all ok" if not failures else "checkpoint crash: %d FAILED" % failures)
sys.exit(1 if failures else 0)
