#!/usr/bin/env python3
"""loom inspect prints each pinned program exactly: every tests/ir_text/inspect/*.ir opens with the
command line that printed it (`# loom inspect ARGS`, run from the source dir) followed by the expected
output. They pin the compile pipeline's stages on the real models (the bench Llama's lowered program
under fsdp x megatron x data on a 2x2 mesh, its bf16 training step, the tiny GPT-2's lowered program),
so a pass that changes what the models compile to shows up here as a diff.

`loom inspect --passes` lists every stage's passes; a bad stage name and a missing config exit 1.

    inspect_test.py LOOM_BINARY SOURCE_DIR

LOOM_UPDATE_IR_TEXT=1 rewrites the expected text from the actual one; review the diff before committing
it (that review is the test's oracle). Uses only the standard library.
"""
import glob
import os
import re
import shlex
import subprocess
import sys

from checks import Checks

LOOM, SRC = sys.argv[1], sys.argv[2]
checks = Checks()
check = checks.check


def loom(*args):
    return subprocess.run([LOOM, *args], cwd=SRC, capture_output=True, text=True, timeout=120)


files = sorted(glob.glob(os.path.join(SRC, "tests", "ir_text", "inspect", "*.ir")))
check("pinned programs exist", len(files) >= 3, str(files))
for path in files:
    with open(path) as f:
        head, expected = f.readline(), f.read()
    args = shlex.split(head[len("# loom "):]) if head.startswith("# loom inspect ") else None
    if args is None:
        check(os.path.basename(path), False, "first line must be '# loom inspect ARGS'")
        continue
    r = loom(*args)
    if os.environ.get("LOOM_UPDATE_IR_TEXT") and r.returncode == 0:
        with open(path, "w") as f:
            f.write(head + r.stdout)
        continue
    diff = ""
    if r.stdout != expected:
        a, b = r.stdout.splitlines(), expected.splitlines()
        i = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
        diff = "line %d: got %r, want %r" % (i + 2, a[i] if i < len(a) else "<end>",
                                             b[i] if i < len(b) else "<end>")
    check(os.path.basename(path), r.returncode == 0 and not diff, r.stderr.strip() + " " + diff)

r = loom("inspect", "--passes")
stages = [line.split()[0] for line in r.stdout.splitlines() if line.strip()]
check("--passes lists every stage in order", r.returncode == 0 and
      [s for i, s in enumerate(stages) if s not in stages[:i]] == ["forward", "train", "sharded", "lowered", "scheduled"],
      r.stdout + r.stderr)
check("--passes names the lowering pass", any(l.split()[1:2] == ["lower"] for l in r.stdout.splitlines()))

# bucketing: the bench Llama (L = 8 layers) under fsdp x data with [passes] bucket = "block" moves
# at most 2 (L + 2) all-gathers and L + 2 reduce-scatters per step (one per parameter group and
# direction), against one per parameter use lowered
FSDP = ["--set", "plan.mesh={data=2}",
        "--set", 'plan.tactics=[{kind="fsdp",axis="data"},{kind="data",axis="data"}]']


def collectives(stage, *extra):
    r = loom("inspect", os.path.join(SRC, "configs", "bench-llama.toml"), "--stage", stage,
             "--rank", "0", *FSDP, *extra)
    line = next((l for l in r.stdout.splitlines() if l.startswith("# axis data:")), "")
    return {op: int(n) for op, n in re.findall(r"(\w+) x(\d+)", line)}, r


lowered, _ = collectives("lowered")
block, r = collectives("scheduled", "--set", "passes.bucket=block")
none, _ = collectives("scheduled", "--set", "passes.bucket=none")
check("bucket = block: <= 2 (L+2) all-gathers, <= L+2 reduce-scatters",
      r.returncode == 0 and 0 < block.get("all_gather", 99) <= 20 and
      0 < block.get("reduce_scatter", 99) <= 10, "%s (lowered: %s) %s" % (block, lowered, r.stderr))
check("lowering gathers each parameter once (one all-gather per gradient reduce-scatter)",
      lowered.get("all_gather", 0) > 70 and lowered.get("all_gather") == lowered.get("reduce_scatter"),
      str(lowered))
check("bucket = none: the lowered collectives, and reshard's gathers again for the backward",
      none.get("reduce_scatter") == lowered.get("reduce_scatter") and
      none.get("all_gather", 0) > 1.8 * lowered.get("all_gather", 0), "%s vs %s" % (none, lowered))
none_once, _ = collectives("scheduled", "--set", "passes.bucket=none",
                           "--set", "passes.reshard_after_forward=false")
check("bucket = none, reshard_after_forward = false: exactly the lowered collectives",
      none_once == lowered, "%s vs %s" % (none_once, lowered))
once, _ = collectives("scheduled", "--set", "passes.reshard_after_forward=false")
check("reshard_after_forward = false: each group gathered once (<= L+2 all-gathers)",
      0 < once.get("all_gather", 99) <= 10 and once.get("reduce_scatter") == block.get("reduce_scatter"),
      "%s vs %s" % (once, block))
r = loom("inspect", os.path.join(SRC, "configs", "bench-llama.toml"), "--stage", "scheduled",
         "--rank", "0", *FSDP, "--set", "passes.bucket=greedy")
check("unknown bucket policy: exit 1 naming the key and the choices",
      r.returncode == 1 and "[passes] bucket" in r.stderr and "auto" in r.stderr,
      r.stderr)
r = loom("inspect", os.path.join(SRC, "configs", "bench-llama.toml"), "--stage", "scheduled",
         "--rank", "0", *FSDP, "--set", "passes.bucket_mb=0")
check("bucket_mb <= 0: exit 1 naming the key", r.returncode == 1 and "[passes] bucket_mb" in r.stderr,
      r.stderr)
r = loom("inspect", os.path.join(SRC, "configs", "bench-llama.toml"), "--stage", "scheduled",
         "--rank", "0", *FSDP, "--set", "passes.bucket=auto", "--set", 'passes.cluster="no-such.toml"')
check("bucket = auto without its cluster file: exit 1 naming the key and the file",
      r.returncode == 1 and "[passes] cluster" in r.stderr and "no-such.toml" in r.stderr, r.stderr)
r = loom("inspect", os.path.join(SRC, "configs", "bench-llama.toml"), "--stage", "scheduled",
         "--rank", "0", *FSDP, "--set", "passes.bucket=auto",
         "--set", 'passes.cluster="%s"' % os.path.join(SRC, "tests", "slow-link.toml"))
check("bucket = auto on a slow link: a bucket per block", r.returncode == 0
      and "all_gather x19 " in r.stdout and "reduce_scatter x10 " in r.stdout, r.stderr + r.stdout[:300])
r = loom("inspect", os.path.join(SRC, "configs", "bench-llama.toml"), "--stage", "scheduled",
         "--rank", "0", *FSDP, "--set", "passes.bucket=auto",
         "--set", 'passes.cluster="%s"' % os.path.join(SRC, "clusters", "h100-sxm.toml"))
m = re.search(r"all_gather x(\d+) ", r.stdout)
check("bucket = auto on H100s (fast links, tiny blocks): fewer, larger buckets than one per block",
      r.returncode == 0 and m is not None and int(m.group(1)) < 19, r.stderr + r.stdout[:300])
_, r = collectives("scheduled", "--set", "passes.max_in_flight=0")
check("max_in_flight < 1: exit 1 naming the key",
      r.returncode == 1 and "[passes] max_in_flight" in r.stderr, r.stderr)

_, r = collectives("scheduled", "--set", "passes.recompute=everything")
check("unknown recompute policy: exit 1 naming the key and the choices",
      r.returncode == 1 and "[passes] recompute" in r.stderr and "selective" in r.stderr
      and "full" in r.stderr, r.stderr)

def planned_peak(*extra):
    _, r = collectives("scheduled", *extra)
    m = re.search(r"# planned peak: ([\d.]+) MB", r.stdout)
    return float(m.group(1)) if m else float("nan")

kept, again = planned_peak(), planned_peak("--set", "passes.recompute=selective")
check("recompute = selective lowers the planned peak", again < kept, "%s vs %s MB" % (again, kept))
full = planned_peak("--set", "passes.recompute=full")
check("recompute = full lowers it further", full < again, "%s vs %s MB" % (full, again))
op = planned_peak("--set", "passes.recompute=selective_op")
check("recompute = selective_op (every second matmul too) lies between selective and full",
      full < op < again, "%s < %s < %s MB" % (full, op, again))
again_mm = {policy: len(re.findall(r"\.recompute[.\w]* : \S+ = matmul\(",
                                   collectives("scheduled", "--set", "passes.recompute=" + policy)[1].stdout))
            for policy in ("selective", "selective_op")}
check("selective_op makes matmuls again, selective none",
      again_mm["selective"] == 0 and again_mm["selective_op"] > 0, str(again_mm))

# prefetch: every collective a start (async = 1) and a wait; off, none of either
_, r = collectives("scheduled")
starts, waits = r.stdout.count("async = 1"), len(re.findall(r"= wait\(", r.stdout))
check("prefetch: one wait per started collective", r.returncode == 0 and starts > 0 and starts == waits,
      "%d starts, %d waits" % (starts, waits))
_, r = collectives("scheduled", "--set", "passes.prefetch=false")
check("prefetch = false: no asynchronous collective",
      r.returncode == 0 and "async" not in r.stdout and "wait(" not in r.stdout, r.stdout[-2000:])

r = loom("inspect", "configs/tiny-llama.toml", "--stage", "scheduled-typo")
check("unknown stage: exit 1 naming it", r.returncode == 1 and "scheduled-typo" in r.stderr, r.stderr)
r = loom("inspect")
check("no config: exit 1", r.returncode == 1 and "config" in r.stderr, r.stderr)
# Without a plan, lowering gives the one-rank program: the training graph node for node (the loss
# told its global row count, which is its own), and the scheduled stage runs on it too.
r = loom("inspect", "configs/tiny-llama.toml", "--stage", "lowered")
t = loom("inspect", "configs/tiny-llama.toml", "--stage", "train")
body = lambda text: [l for l in text.splitlines() if l.startswith("  ")]
low, train = body(r.stdout), body(t.stdout)
check("lowered without a plan: the one-rank program, the training graph node for node",
      r.returncode == 0 and "# rank 0 of 1: {}" in r.stdout and len(low) == len(train) > 100
      and all(a == b or a.startswith(b + " {rows = ") for a, b in zip(low, train)),
      r.stderr + "".join("\n%s\n%s" % (a, b) for a, b in zip(low, train) if a != b)[:2000])

# --passes with a config: whether each pass changed this config's step
def changed(*sets):
    args = ["inspect", "configs/tiny-llama.toml", "--passes"]
    for kv in sets:
        args += ["--set", kv]
    r = loom(*args)
    return r.returncode, {l.split()[1]: l.split()[2] for l in r.stdout.splitlines() if len(l.split()) > 2}


rc, plain = changed()
listed = len(loom("inspect", "--passes").stdout.splitlines())
# (dce drops the loss's gradient seed of 1, which cross_entropy's fused backward does not read)
check("--passes with a config: one process's scheduled passes change nothing but dead code",
      rc == 0 and len(plain) == listed and plain["build_model"] == "changed"
      and all(plain[p] == "unchanged" for p in ("reshard", "recompute", "gather_cast",
                                                  "bucket", "prefetch")), str(plain))
check("--passes with a config: recast changes nothing in f32", plain.get("recast") == "unchanged",
      str(plain))
rc, bf16 = changed("model.dtype=bf16")
check("--passes: bf16 weights' casts are made again for the backward (recast changes the step)",
      rc == 0 and bf16.get("recast") == "changed", str(bf16))
rc, kept = changed("model.dtype=bf16", "passes.recast=false")
check("--passes: recast = false keeps the forward's casts (recast changes nothing)",
      rc == 0 and kept.get("recast") == "unchanged", str(kept))
rc, rec = changed('passes.recompute="full"')
check("--passes: recompute = full changes the program (and nothing else scheduled does)",
      rc == 0 and rec.get("recompute") == "changed" and rec.get("bucket") == "unchanged", str(rec))
rc, fsdp = changed("plan.mesh={data=2}",
                   'plan.tactics=[{kind="fsdp",axis="data"},{kind="data",axis="data"}]')
check("--passes: fsdp's collectives are bucketed and prefetched",
      rc == 0 and fsdp.get("bucket") == "changed" and fsdp.get("prefetch") == "changed", str(fsdp))

checks.finish()
