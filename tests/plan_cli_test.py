#!/usr/bin/env python3
"""loom train with a [plan], as a user runs it, against the same config on one process:

  1. every tactic, with its ranks as threads ([plan] ranks = "local") and as mpirun processes, logs
     the losses of the unsharded run at every step (f32, within 1e-5 relative) and the same
     validation losses; fsdp under mpirun with [train] grad_accum = 2 micro-batches of half the
     rows logs the straight run's training losses, and with [passes] reduce_dtype = "bf16" (and
     megatron + sequence with activation_reduce_dtype = "bf16") its
     losses within 1%;
  2. a checkpoint written under one plan (sharded: rank files and an index) resumes under another
     plan, and under no plan, continuing with the straight run's losses; loom export and loom
     sample read it; a copy missing a rank's file is named and passed over; a rank SIGKILLed mid-run ends the mpirun job (no hang) and the
     run resumes from its last checkpoint (as threads) with the losses of the same plan run straight;
  3. plan errors (an unknown axis or tactic, a mesh that does not match the ranks, a dim its axes do
     not divide, two tactics splitting one value over one axis) exit non-zero before training, with
     a message naming the tactic, the value and the axis.

A rank that cannot start fails the test; nothing is skipped.

    plan_cli_test.py LOOM_BINARY SOURCE_DIR
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from textdata import write_pseudo_english

LOOM, SRC = sys.argv[1], sys.argv[2]
CONFIG = os.path.join(SRC, "configs", "tiny-llama.toml")
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
          "-x", "OMP_NUM_THREADS", "-x", "OMP_WAIT_POLICY"]
ENV = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="passive")
failures = 0

DATA_TACTIC = '{kind="data",axis="data"}'
PLANS = {
    "data": ("{data=2}", "[%s]" % DATA_TACTIC),
    "fsdp": ("{data=2}", '[{kind="fsdp",axis="data"},%s]' % DATA_TACTIC),
    "zero1": ("{data=2}", '[{kind="zero1",axis="data"},%s]' % DATA_TACTIC),
    "zero2": ("{data=2}", '[{kind="zero2",axis="data"},%s]' % DATA_TACTIC),
    "megatron": ("{model=2}", '[{kind="megatron",axis="model"}]'),
    "megatron+sequence": ("{model=2}",
                          '[{kind="megatron",axis="model"},{kind="sequence",axis="model"}]'),
    "fsdp x megatron": ("{data=2,model=2}",
                        '[{kind="megatron",axis="model"},{kind="fsdp",axis="data"},%s]'
                        % DATA_TACTIC),
}


def fail(msg):
    global failures
    failures += 1
    print("FAIL " + msg)


def train_args(run, data, plan=None, ranks="mpi", extra=()):
    a = [LOOM, "train", CONFIG, "--run-dir", run, "--set", "data.path=" + data,
         "--set", "train.steps=20", "--set", "train.warmup_steps=4", "--set", "train.eval_every=10",
         "--set", "train.seq_len=32", "--set", "checkpoint.every=10", "--set", "checkpoint.keep=0",
         "--set", "optim.lr=3e-3"] + list(extra)
    if plan:
        mesh, tactics = PLANS[plan]
        a += ["--set", "plan.mesh=" + mesh, "--set", "plan.tactics=" + tactics,
              "--set", "plan.ranks=" + ranks]
    return a


def ranks_of(plan):
    mesh = PLANS[plan][0].strip("{}")
    n = 1
    for part in mesh.split(","):
        n *= int(part.split("=")[1])
    return n


def run(args, mpi_ranks=0):
    cmd = (MPIRUN + ["-np", str(mpi_ranks)] + args) if mpi_ranks else args
    return subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300)


def metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def compare(name, got, want, first_step=1):
    want = [m for m in want if m["step"] >= first_step]
    if [m["step"] for m in got] != [m["step"] for m in want]:
        fail("%s: steps %s, expected %s" % (name, [m["step"] for m in got],
                                             [m["step"] for m in want]))
        return
    worst = max(abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(got, want))
    vals = [(a.get("val_loss"), b.get("val_loss")) for a, b in zip(got, want)]
    val_worst = max([abs(a - b) / abs(b) for a, b in vals if b is not None] + [0])
    if worst > 1e-5 or val_worst > 1e-5 or any((a is None) != (b is None) for a, b in vals):
        fail("%s: worst relative loss difference %.3g, validation %.3g" % (name, worst, val_worst))
    else:
        print("ok   %s: %d steps, worst relative loss difference %.2g" % (name, len(got), worst))


def expect_error(name, result, *needles):
    out = result.stdout + result.stderr
    if result.returncode == 0:
        fail("%s: exited 0" % name)
    elif "Traceback" in out or "terminate called" in out or "Segmentation" in out:
        fail("%s: crashed: %s" % (name, out[-500:]))
    elif not all(n in out for n in needles):
        fail("%s: message lacks %s: %s" % (name, needles, out[-800:]))
    else:
        print("ok   %s: exit %d, %s" % (name, result.returncode,
                                       next(l for l in out.splitlines() if needles[0] in l).strip()))


with tempfile.TemporaryDirectory() as d:
    data = os.path.join(d, "text.txt")
    write_pseudo_english(data)
    straight = os.path.join(d, "straight")
    r = run(train_args(straight, data))
    if r.returncode != 0:
        print("FAIL the unsharded run exited %d: %s" % (r.returncode, r.stderr))
        sys.exit(1)
    ref = metrics(straight)

    # 1. every tactic, local and mpirun
    for plan in PLANS:
        for launcher in ["local", "mpirun"]:
            rd = os.path.join(d, "%s-%s" % (plan.replace(" ", "_"), launcher))
            if launcher == "local":
                r = run(train_args(rd, data, plan, "local"))
            else:
                r = run(train_args(rd, data, plan, "mpi"), mpi_ranks=ranks_of(plan))
            if r.returncode != 0:
                fail("%s under %s exited %d: %s" % (plan, launcher, r.returncode,
                                                    (r.stdout + r.stderr)[-1500:]))
                continue
            compare("%s under %s" % (plan, launcher), metrics(rd), ref)

    # 1b. micro-batches under a plan: fsdp under mpirun with 2 micro-batches of 2 rows takes the
    # straight run's steps of 4 rows (the same tokens); validation reads batches of 2 rows then, so
    # only the training losses compare
    rd = os.path.join(d, "fsdp-accum-mpirun")
    r = run(train_args(rd, data, "fsdp", "mpi", ["--set", "train.batch_size=2", "--set",
                                                   "train.grad_accum=2"]), mpi_ranks=2)
    if r.returncode != 0:
        fail("fsdp with grad_accum = 2 under mpirun exited %d: %s"
             % (r.returncode, (r.stdout + r.stderr)[-1500:]))
    else:
        compare("fsdp with grad_accum = 2 (batch 2) under mpirun against batch 4",
                [{k: v for k, v in m.items() if k != "val_loss"} for m in metrics(rd)],
                [{k: v for k, v in m.items() if k != "val_loss"} for m in ref])

    # 1c. gradients reduced in bf16 ([passes] reduce_dtype) under mpirun (MPI's bf16 sum): the
    # straight run's losses within 1% (each gradient rounded to bf16 once per reduction)
    rd = os.path.join(d, "fsdp-bf16-reduce-mpirun")
    r = run(train_args(rd, data, "fsdp", "mpi", ["--set", "passes.reduce_dtype=bf16"]), mpi_ranks=2)
    got = metrics(rd) if r.returncode == 0 else []
    worst = max([abs(a["loss"] - b["loss"]) / b["loss"] for a, b in zip(got, ref)] + [0])
    if r.returncode != 0 or len(got) != len(ref) or worst > 1e-2 or worst == 0:
        fail("fsdp with reduce_dtype = bf16 under mpirun: rc %d, %d steps, worst relative loss "
             "difference %.3g: %s" % (r.returncode, len(got), worst, (r.stdout + r.stderr)[-800:]))
    else:
        print("ok   fsdp with reduce_dtype = bf16 under mpirun: %d steps, worst relative loss "
              "difference %.2g" % (len(got), worst))

    # 1d. tensor parallelism's partial products reduced in bf16 ([passes] activation_reduce_dtype)
    # under mpirun: megatron + sequence's reduce-scatters as MPI's bf16 sums, the straight run's
    # losses within 1%
    rd = os.path.join(d, "megatron-sequence-bf16-reduce-mpirun")
    r = run(train_args(rd, data, "megatron+sequence", "mpi",
                       ["--set", "passes.activation_reduce_dtype=bf16"]), mpi_ranks=2)
    got = metrics(rd) if r.returncode == 0 else []
    worst = max([abs(a["loss"] - b["loss"]) / b["loss"] for a, b in zip(got, ref)] + [0])
    if r.returncode != 0 or len(got) != len(ref) or worst > 1e-2 or worst == 0:
        fail("megatron + sequence with activation_reduce_dtype = bf16 under mpirun: rc %d, %d "
             "steps, worst relative loss difference %.3g: %s"
             % (r.returncode, len(got), worst, (r.stdout + r.stderr)[-800:]))
    else:
        print("ok   megatron + sequence with activation_reduce_dtype = bf16 under mpirun: %d steps, "
              "worst relative loss difference %.2g" % (len(got), worst))

    # 2. checkpoints across plans: the fsdp run's step-10 checkpoint, resumed elsewhere. It is
    # sharded: each rank's blocks in its file and an index, no whole-model file
    src = os.path.join(d, "fsdp-mpirun")
    ck = os.path.join(src, "checkpoints", "step_00000020")
    files = sorted(os.listdir(ck)) if os.path.isdir(ck) else []
    if files != ["config.toml", "index.json", "rank-00000.safetensors", "rank-00001.safetensors",
                 "state.json"]:
        fail("the fsdp run's checkpoint is not sharded: %s" % files)
    else:
        print("ok   the fsdp run's checkpoint holds rank files and an index: %s" % files)
    # ... which loom export and loom sample read (its tensors assembled from the blocks)
    out = os.path.join(d, "fsdp-export")
    r = run([LOOM, "export", src, "--hf", out])
    s = run([LOOM, "sample", src, "--prompt", "the ", "--max-tokens", "8"])
    if r.returncode != 0 or not os.path.exists(os.path.join(out, "model.safetensors")) or \
            s.returncode != 0:
        fail("export (rc %d) or sample (rc %d) of the sharded checkpoint: %s" % (
            r.returncode, s.returncode, (r.stderr + s.stderr)[-800:]))
    else:
        print("ok   loom export and loom sample read the sharded checkpoint")
    # ... and a copy missing a rank's file is passed over for the checkpoint before it
    rd = os.path.join(d, "fsdp-missing-rank")
    shutil.copytree(src, rd)
    os.remove(os.path.join(rd, "checkpoints", "step_00000020", "rank-00001.safetensors"))
    r = run(train_args(rd, data, "fsdp", "local", ["--resume", "auto"]))
    if r.returncode != 0 or "rank-00001.safetensors is missing" not in r.stderr or \
            "resuming from" not in r.stderr or "step_00000010" not in r.stderr:
        fail("a sharded checkpoint missing a rank file: rc %d: %s" % (r.returncode,
                                                                      r.stderr[-800:]))
    else:
        print("ok   a sharded checkpoint missing a rank file: named, and the run resumes from "
              "step 10")
    for target, launcher in [("fsdp x megatron", "local"), ("megatron", "mpirun"), (None, "")]:
        rd = os.path.join(d, "resume-%s" % (target or "single").replace(" ", "_"))
        if not os.path.isdir(src):
            fail("no fsdp run to resume from")
            break
        shutil.copytree(src, rd)
        shutil.rmtree(os.path.join(rd, "checkpoints", "step_00000020"))
        args = train_args(rd, data, target, "local" if launcher == "local" else "mpi",
                          ["--resume", "auto"])
        r = run(args, mpi_ranks=ranks_of(target) if launcher == "mpirun" else 0)
        name = "fsdp checkpoint resumed under %s" % (target or "one process")
        if r.returncode != 0:
            fail("%s exited %d: %s" % (name, r.returncode, (r.stdout + r.stderr)[-1500:]))
            continue
        if "resuming from" not in r.stderr:
            fail("%s: did not resume: %s" % (name, r.stderr[-500:]))
            continue
        compare(name, [m for m in metrics(rd) if m["step"] > 10], ref, first_step=11)

    # 2b. a rank SIGKILLed mid-run: the job ends (no hang), the last checkpoint is whole, and the
    # run resumes from it (under another launcher) with the straight run's losses. The killed run
    # writes its checkpoints asynchronously ([checkpoint] async: the ranks agree on each commit).
    long_run = ["--set", "train.steps=300", "--set", "train.eval_every=0"]
    long_ref_dir = os.path.join(d, "straight-long")
    # over 300 steps a different sum order drifts by more than 1e-5, so the reference for the
    # resumed steps is the same plan run straight through
    r = run(train_args(long_ref_dir, data, "fsdp", "local", long_run))
    long_ref = metrics(long_ref_dir) if r.returncode == 0 else []
    if r.returncode != 0:
        fail("the 300-step fsdp run exited %d" % r.returncode)
    killed = os.path.join(d, "killed")
    cmd = MPIRUN + ["-np", "2"] + train_args(killed, data, "fsdp", "mpi",
                                             long_run + ["--set", "checkpoint.async=true"])
    p = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    first = os.path.join(killed, "checkpoints", "step_00000010")
    deadline = time.time() + 120
    while not os.path.exists(first) and p.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    victim = None
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/environ" % pid, "rb") as f:
                env = f.read().split(b"\0")
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                cmdline = f.read()
        except OSError:
            continue
        if b"OMPI_COMM_WORLD_RANK=1" in env and killed.encode() in cmdline:
            victim = int(pid)
    if victim is None or p.poll() is not None:
        fail("rank kill: no running rank 1 to kill (mpirun rc %s)" % p.poll())
        p.kill()
    else:
        os.kill(victim, signal.SIGKILL)
        try:
            rc = p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = None
        if rc is None:
            fail("rank kill: mpirun still running 60 s after rank 1 was killed")
        elif rc == 0:
            fail("rank kill: mpirun exited 0 after a rank was killed")
        else:
            r = run(train_args(killed, data, "fsdp", "local", long_run + ["--resume", "auto"]))
            if r.returncode != 0:
                fail("rank kill: the resume exited %d: %s" % (r.returncode, r.stderr[-800:]))
            else:
                resumed_from = [l for l in r.stderr.splitlines() if "resuming from" in l]
                print("ok   rank 1 SIGKILLed: mpirun exited %d; %s" % (rc, resumed_from[0].strip()
                                                                     if resumed_from else "?"))
                step = int(resumed_from[0].split("(step ")[1].rstrip(")")) if resumed_from else 0
                if step < 10 or step >= 300:
                    fail("rank kill: resumed from step %d" % step)
                else:
                    compare("resume after the kill", [m for m in metrics(killed) if m["step"] > step],
                            long_ref, first_step=step + 1)

    # 3. plan errors, before training
    bad = os.path.join(d, "bad")

    def bad_args(mesh, tactics, ranks="local"):
        shutil.rmtree(bad, ignore_errors=True)
        return [LOOM, "train", CONFIG, "--run-dir", bad, "--set", "data.path=" + data,
                "--set", "plan.mesh=" + mesh, "--set", "plan.tactics=" + tactics,
                "--set", "plan.ranks=" + ranks]

    expect_error("unknown axis", run(bad_args("{data=2}", '[{kind="data",axis="batch"}]')),
                 "tactics[0] (data)", "'batch'", "{data = 2}")
    expect_error("unknown tactic", run(bad_args("{data=2}", '[{kind="ddp",axis="data"}]')),
                 "tactics[0]", "unknown tactic kind 'ddp'")
    expect_error("mesh without mpirun", run(bad_args("{data=2}", "[%s]" % DATA_TACTIC, "mpi")),
                 "not started by mpirun", "mpirun -np 2")
    expect_error("mesh larger than the job",
                 run(bad_args("{data=4}", "[%s]" % DATA_TACTIC, "mpi"), mpi_ranks=2),
                 "mpirun started 2", "{data = 4}")
    expect_error("dim not divisible",
                 run(bad_args("{model=3}",
                              '[{kind="shard",axis="model",pattern="lm_head.weight",dim=1}]')),
                 "tactics[0] (shard)", "%lm_head.weight", "not divisible by 3")
    expect_error("two tactics, one axis",
                 run(bad_args("{data=2}", '[{kind="fsdp",axis="data"},{kind="zero1",axis="data"}]')),
                 "tactics[1] (zero1)", "already split over axis 'data'", "tactics[0] (fsdp)")
    expect_error("pattern matching nothing",
                 run(bad_args("{model=2}", '[{kind="shard",axis="model",pattern="nope*",dim=0}]')),
                 "tactics[0] (shard)", "'nope*' matches no value")
    expect_error("mesh not a table", run(bad_args("3", "[%s]" % DATA_TACTIC)),
                 "[plan] mesh", "expected a table of axis sizes")
    expect_error("axis of size 0", run(bad_args("{data=0}", "[%s]" % DATA_TACTIC)),
                 "[plan] mesh", "axis data has size 0")
    expect_error("tactic without an axis", run(bad_args("{data=2}", '[{kind="data"}]')),
                 "[plan] tactics[0]", "missing key 'axis'")
    expect_error("pattern on a tactic that reads none",
                 run(bad_args("{data=2}", '[{kind="fsdp",axis="data",pattern="*",dim=0}]')),
                 "[plan] tactics[0]", "a fsdp tactic takes no pattern or dim")
    expect_error("shard without its pattern",
                 run(bad_args("{data=2}", '[{kind="shard",axis="data"}]')),
                 "[plan] tactics[0]", "a shard tactic needs pattern and dim")
    expect_error("unknown tactic key",
                 run(bad_args("{data=2}", '[{kind="data",axis="data",axes="x"}]')),
                 "[plan] tactics[0]", "unknown key 'axes'")
    expect_error("unknown ranks", run(bad_args("{data=2}", "[%s]" % DATA_TACTIC, "gpu")),
                 "[plan] ranks", "expected \"mpi\" or \"local\"")
    if os.path.exists(os.path.join(bad, "checkpoints")):
        fail("a rejected plan left checkpoints behind")

print("plan_cli: %d failure(s)" % failures)
sys.exit(1 if failures else 0)
