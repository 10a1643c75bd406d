#!/usr/bin/env python3
"""What the bad-input checks cost a training step, measured in one `loom train` run (JSON).

    bench/check_cost.py LOOM CONFIG DATA_DIR [--steps N] [--every K] [--set section.key=value ...]

The checks on the training path are the token shard's (each batch read with checked `pread`s after
an `fstat` that compares the file's size and modification time with what they were at open, every
token checked against the vocabulary), the metrics log's (each line's write checked, synced at each
checkpoint) and the checkpoint's (each tensor's CRC-32 computed as it is written, the files written
to a temporary, fsynced and renamed). The run's metrics give, per step, the wall time between two
lines (`elapsed_s`) and the step's own time (`tokens_per_s`); what is outside the step on a line
that follows no checkpoint is everything the loop does besides the step (the batch read with its
checks, the metrics line and its checked write, the progress line): an upper bound on those checks'
cost. A line that follows a checkpoint holds its save as well. Peers measured here, on the run's
last checkpoint: zlib's CRC-32 over its bytes (what the checksums add), and a plain copy of its
files with one fsync each (a write without the checks).

Prints one JSON object. Step times are medians over the steps that hold no evaluation (the first
and the last) and follow no checkpoint; saves are the median over the run's checkpoints.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zlib


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("loom")
    ap.add_argument("config")
    ap.add_argument("data")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--every", type=int, default=6, help="checkpoint every K steps")
    ap.add_argument("--set", action="append", default=[])
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        run = os.path.join(d, "run")
        sets = ["data.path=" + a.data, "train.steps=%d" % a.steps, "checkpoint.every=%d" % a.every,
                "checkpoint.keep=%d" % (a.steps // a.every + 1), "train.eval_every=0"] + a.set
        cmd = [a.loom, "train", a.config, "--run-dir", run]
        for s in sets:
            cmd += ["--set", s]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        lines = [json.loads(x) for x in open(os.path.join(run, "metrics.jsonl")) if x.strip()]
        cfg = open(os.path.join(run, "config.toml")).read()
        by_step = {m["step"]: m for m in lines if "step" in m}
        plain, after_save = [], []
        step_s = []
        for s in range(2, a.steps):
            m, prev = by_step[s], by_step[s - 1]
            if "val_loss" in m:
                continue
            wall = m["elapsed_s"] - prev["elapsed_s"]
            own = tokens_per_step(cfg) / m["tokens_per_s"]  # the step's own time
            outside = wall - own
            if (s - 1) % a.every == 0:
                after_save.append(outside)
            else:
                plain.append(outside)
                step_s.append(own)
        ckpts = sorted(os.listdir(os.path.join(run, "checkpoints")))
        last = os.path.join(run, "checkpoints", ckpts[-1])
        files = [os.path.join(last, f) for f in sorted(os.listdir(last))]
        nbytes = sum(os.path.getsize(f) for f in files)
        t0 = time.perf_counter()
        for f in files:
            with open(f, "rb") as h:
                zlib.crc32(h.read())
        crc_s = time.perf_counter() - t0
        copy_dir = os.path.join(d, "copy")
        os.makedirs(copy_dir)
        t0 = time.perf_counter()
        for f in files:
            dst = os.path.join(copy_dir, os.path.basename(f))
            shutil.copyfile(f, dst)
            fd = os.open(dst, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
        copy_s = time.perf_counter() - t0
    med_step = statistics.median(step_s)
    med_plain = statistics.median(plain)
    save_s = [x - med_plain for x in after_save]
    out = {
        "config": a.config,
        "steps": a.steps,
        "step_s_median": round(med_step, 4),
        "outside_step_s_median": round(med_plain, 6),
        "outside_step_share": round(med_plain / med_step, 6),
        "outside_step_s_range": [round(min(plain), 6), round(max(plain), 6)],
        "checkpoints": len(save_s),
        "checkpoint_bytes": nbytes,
        "checkpoint_save_s_median": round(statistics.median(save_s), 4),
        "checkpoint_save_s_range": [round(min(save_s), 4), round(max(save_s), 4)],
        "peer_crc32_s": round(crc_s, 4),
        "peer_copy_fsync_s": round(copy_s, 4),
        "checkpoint_save_share_of_step_at_every": round(statistics.median(save_s) /
                                                        (a.every * med_step), 5),
    }
    print(json.dumps(out))


def tokens_per_step(cfg_text):
    """batch_size x grad_accum x seq_len from the run's resolved config.toml."""
    vals = {}
    section = ""
    for line in cfg_text.splitlines():
        line = line.strip()
        if line.startswith("["):
            section = line.strip("[]")
        elif "=" in line and section == "train":
            k, v = (x.strip() for x in line.split("=", 1))
            vals[k] = v
    return int(vals["batch_size"]) * int(vals.get("grad_accum", "1")) * int(vals["seq_len"])


if __name__ == "__main__":
    sys.exit(main())
