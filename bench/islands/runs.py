"""What the island benchmarks share: running `loom islands` and reading what a run leaves.

Used by the benchmarks of bench/islands/ and by bench/diloco/run.py.
"""
import glob
import json
import os
import subprocess
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LOOM = os.path.join(ROOT, "build/release/tools/loom/loom")  # the benchmarks' default --loom


def add_run_args(ap, name, config="bench/diloco/diloco.toml", data="data/gutenberg-bpe2048"):
    """The arguments every island benchmark takes: --loom, --out (runs/NAME), --config and --data
    (their defaults relative to the repository)."""
    ap.add_argument("--loom", default=LOOM)
    ap.add_argument("--out", default=os.path.join(ROOT, "runs", name))
    ap.add_argument("--config", default=os.path.join(ROOT, config))
    ap.add_argument("--data", default=os.path.join(ROOT, data))


def island_env(**more):
    """The environment islands run in: passive OpenMP waits (many processes share the cores), a
    shared token ($LOOM_OUTER_TOKEN, else a random one), and `more`."""
    env = dict(os.environ, OMP_WAIT_POLICY="passive", **more)
    env.setdefault("LOOM_OUTER_TOKEN", os.urandom(16).hex())
    return env


def last_val(run_dir):
    """The last val_loss RUN_DIR/metrics.jsonl logged, or None."""
    val = None
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            j = json.loads(line)
            if j.get("val_loss") is not None:
                val = j["val_loss"]
    return val


def last_checkpoint(run_dir):
    """RUN_DIR/checkpoints/step_* of the highest step (names are zero-padded: the last sorted)."""
    ck = os.path.join(run_dir, "checkpoints")
    steps = sorted(d for d in os.listdir(ck) if d.startswith("step_"))
    if not steps:
        raise SystemExit(f"{ck}: no checkpoint")
    return os.path.join(ck, steps[-1])


def summary_row(s, run_dir=None):
    """What the island benchmarks report of a run's summary.json (and, given its run dir, of an
    async run's metrics: the mean over every island's rounds of the steps it trained past a push
    before it took that push's period, `ahead_steps`, and their share of its steps)."""
    row = {"val_loss": s["val_loss"], "version": s["version"], "wall_s": round(s["wall_s"], 1),
           "wait_share_max": s.get("wait_share_max"),
           "island_steps": [i["steps"] for i in s["per_island"]]}
    ahead = ahead_steps(run_dir) if run_dir else None
    if ahead:
        row["ahead_steps_mean"] = round(sum(ahead) / len(ahead), 2)
        row["ahead_share"] = round(sum(ahead) / sum(row["island_steps"]), 4)
    return row


def ahead_steps(run_dir):
    """Each async round's ahead_steps (metrics.jsonl: the value after the round that set it), over
    every island of RUN_DIR; [] for a sync run."""
    out = []
    for d in sorted(glob.glob(os.path.join(run_dir, "island_*"))):
        last = {}
        with open(os.path.join(d, "metrics.jsonl")) as f:
            for line in f:
                m = json.loads(line)
                if "ahead_steps" in m:
                    last[m["outer_round"]] = m["ahead_steps"]
        out += [v for r, v in sorted(last.items()) if r > 0]
    return out


def run_islands(loom, config, run_dir, islands, sets, slow=None, env=None, quiet=False,
                stalls=()):
    """`loom islands CONFIG --islands N --run-dir RUN_DIR --set S ...` (island 0 slowed by `slow`,
    "F", or each island I of a list of "I=F" specs; `stalls`: "I=STEP:SECONDS" specs), from the
    repository root; returns RUN_DIR/summary.json."""
    cmd = [loom, "islands", config, "--islands", str(islands), "--run-dir", run_dir]
    for s in sets:
        cmd += ["--set", s]
    for s in [] if not slow else [slow] if isinstance(slow, str) else slow:
        cmd += ["--slow", s if "=" in s else "0=%s" % s]
    for s in stalls:
        cmd += ["--stall", s]
    if not quiet:
        print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, env=env, cwd=ROOT,
                   stdout=subprocess.DEVNULL if quiet else None)
    with open(os.path.join(run_dir, "summary.json")) as f:
        return json.load(f)


def timed(cmd, env=None, quiet=False):
    """Runs cmd from the repository root; returns its wall seconds."""
    if not quiet:
        print("+", " ".join(cmd), flush=True)
    t0 = time.time()
    subprocess.run(cmd, check=True, env=env, cwd=ROOT,
                   stdout=subprocess.DEVNULL if quiet else None)
    return time.time() - t0
