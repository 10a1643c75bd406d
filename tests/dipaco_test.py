#!/usr/bin/env python3
"""DiPaCo through the CLI, on a corpus of two kinds of text (files of English words, files of digit
groups) and tiny-llama.toml with modules [1, 2] (two paths sharing level 0):

- `loom dipaco route` sends every training document of one kind to one path and every document of
  the other kind to the other (the router separates what the base model sees as different), and
  writes each path's documents as a data directory;
- `loom islands` trains the two paths (one island each) and writes RUN/path_0, RUN/path_1;
- `loom dipaco eval` routes the held-out documents (every 20th of the training split, of both kinds,
  and the validation file's, digits) to the path of their kind, which scores them better than the
  mean path;
- `loom sample RUN --path auto` routes a prompt of each kind to its kind's path; --path N picks one;
- bad input is a clear error: no [outer] modules, a router directory already there, islands not a
  multiple of the paths, an island count the router does not have, a path out of range, a run that is
  not DiPaCo.

    dipaco_test.py LOOM_BINARY SOURCE_DIR
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

LOOM, SRC = sys.argv[1], sys.argv[2]
CONFIG = os.path.join(SRC, "configs", "tiny-llama.toml")
failures = 0
env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="passive",
           LOOM_OUTER_TOKEN="dipaco-test-token")


def check(ok, what, detail=""):
    global failures
    print("%-4s %s%s" % ("ok" if ok else "FAIL", what, (": " + detail) if detail and not ok else ""),
          flush=True)
    failures += 0 if ok else 1
    return ok


def run(*args):
    return subprocess.run([LOOM] + list(args), env=env, capture_output=True, text=True,
                          timeout=300)


def sets(**kv):
    return [y for k, v in kv.items() for y in ("--set", "%s=%s" % (k.replace("__", "."), v))]


def shard_bytes(path):
    """The tokens of a loom token shard (byte-level: the text) as bytes."""
    with open(path, "rb") as f:
        head = f.read(32)
        magic, _, dtype, count = struct.unpack("<8sIIQ", head[:24])
        assert magic == b"LOOMTOK1" and dtype == 1, (magic, dtype)
        return bytes(struct.unpack("<%dH" % count, f.read(2 * count)))


WORDS = b"the cat sat on a mat and saw the dog run to the old tree by the river "
DIGITS = b"1024 2048 4096 8192 16384 32768 65536 131072 262144 "

with tempfile.TemporaryDirectory() as d:
    data = os.path.join(d, "text")
    os.makedirs(data)
    # 10 files (every 10th, b4, held out for validation): a0..a4 words, b0..b4 digits, as much
    # training text of each kind (the router's clusters are balanced)
    for i in range(5):
        open(os.path.join(data, "a%d.txt" % i), "wb").write((WORDS * 400)[:20000])
        open(os.path.join(data, "b%d.txt" % i), "wb").write((DIGITS * 500)[:25000])
    common = sets(data__path=data, train__steps=40, train__warmup_steps=5, checkpoint__every=0)
    dipaco = sets(outer__modules="[1,2]")
    base = os.path.join(d, "base")
    r = run("train", CONFIG, "--run-dir", base, *common)
    if not check(r.returncode == 0, "the base model trains", r.stderr[-500:]):
        sys.exit(1)

    # ---- the router ----
    router = os.path.join(d, "router")
    r = run("dipaco", "route", CONFIG, "--base", base, "--out", router, "--doc-tokens", "256",
            *common, *dipaco)
    check(r.returncode == 0, "dipaco route exits 0", r.stderr[-500:])
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    check(len(lines) == 2 and all(x["train_docs"] > 0 for x in lines),
          "a line per path: %s" % lines)
    kinds = []
    for p in range(2):
        text = shard_bytes(os.path.join(router, "path_%d" % p, "train.bin"))
        words, digits = sum(c in b"abcdefghijklmnopqrstuvwxyz" for c in text), \
            sum(c in b"0123456789" for c in text)
        kinds.append("words" if words > digits else "digits")
        # a document that starts in one file may end in the next: at most 9 such
        check(min(words, digits) <= 9 * 256, "path %d's training documents are of one kind (%d "
              "letters, %d digits)" % (p, words, digits))
    check(sorted(kinds) == ["digits", "words"], "the two kinds go to the two paths: %s" % kinds)
    digit_path = kinds.index("digits") if "digits" in kinds else 0
    r = run("dipaco", "route", CONFIG, "--base", base, "--out", router, *common, *dipaco)
    check(r.returncode == 1 and "already holds a router" in r.stderr,
          "routing into a router directory again: exit %s: %s" % (r.returncode, r.stderr.strip()))
    r = run("dipaco", "route", CONFIG, "--base", base, "--out", os.path.join(d, "r2"), *common)
    check(r.returncode == 1 and "[outer] modules is not set" in r.stderr,
          "routing without modules: exit %s: %s" % (r.returncode, r.stderr.strip()))

    # ---- the paths trained ----
    isl = sets(outer__router=router, outer__inner_steps=10, outer__lr=1.0, outer__momentum=0.5,
               model__init=os.path.join(base, "checkpoints", "step_00000040"))
    r = run("islands", CONFIG, "--islands", "3", "--run-dir", os.path.join(d, "bad"),
            *common, *dipaco, *isl)
    check(r.returncode == 1 and "a multiple of the 2 paths" in r.stderr,
          "3 islands for 2 paths: exit %s: %s" % (r.returncode, r.stderr.strip()))
    r = run("islands", CONFIG, "--islands", "4", "--run-dir", os.path.join(d, "bad2"),
            *common, *sets(outer__modules="[2,2]"), *isl)
    check(r.returncode == 1 and "routes to 2 paths, [outer] modules make 4" in r.stderr,
          "a router of 2 paths for 4: exit %s: %s" % (r.returncode, r.stderr.strip()))
    runs = os.path.join(d, "run")
    r = run("islands", CONFIG, "--islands", "2", "--run-dir", runs, *common, *dipaco, *isl)
    if not check(r.returncode == 0, "loom islands trains the 2 paths", r.stderr[-800:]):
        sys.exit(1)
    s = json.load(open(os.path.join(runs, "summary.json")))
    check(s["version"] == 4 and [p["name"] for p in s["per_path"]] == ["0.0", "0.1"],
          "4 rounds, paths 0.0 and 0.1 evaluated: %s" % s.get("per_path"))
    check(all(os.path.exists(os.path.join(runs, "path_%d" % p, "model.safetensors"))
              for p in range(2)), "RUN/path_<p>/model.safetensors written")

    # ---- the held-out documents, and prompts ----
    r = run("dipaco", "eval", runs, "--dense", base)
    if check(r.returncode == 0, "dipaco eval exits 0", r.stderr[-500:]):
        out = json.loads(r.stdout)
        for name in ("heldout", "val"):
            e = out[name]
            check(e["docs"] > 0 and e["routed_beats_mean_path"] == 1.0
                  and e["routed_loss"] < e["mean_path_loss"] and "dense_loss" in e,
                  "%s: every document goes to a path that beats the mean path: routed %.3f, mean "
                  "path %.3f, %s of %d" % (name, e["routed_loss"], e["mean_path_loss"],
                                           e["routed_beats_mean_path"], e["docs"]))
        held = [p["routed_docs"] for p in out["heldout"]["per_path"]]
        check(min(held) > 0, "held-out documents of both kinds, routed to both paths: %s" % held)
        routed = [p["path"] for p in out["val"]["per_path"] if p["routed_docs"]]
        check(routed == [digit_path], "the validation file's digits go to path %d (routed to %s)"
              % (digit_path, routed))
    for prompt, want in (("1024 2048 4096 8192", digit_path), ("the cat sat on a mat", 1 - digit_path)):
        r = subprocess.run([LOOM, "sample", runs, "--path", "auto", "--prompt", prompt,
                            "--max-tokens", "8", "--temperature", "0"], env=env,
                           capture_output=True, text=True, timeout=120)
        check(r.returncode == 0 and "dipaco: path %d (routed)" % want in r.stderr
              and r.stdout.startswith(prompt),
              "sample --path auto routes %r to path %d: %s" % (prompt, want, r.stderr.strip()))
    r = subprocess.run([LOOM, "sample", runs, "--path", "1", "--prompt", "x", "--max-tokens", "4"],
                       env=env, capture_output=True, text=True, timeout=120)
    check(r.returncode == 0 and "dipaco: path 1 (chosen)" in r.stderr, "sample --path 1")
    r = subprocess.run([LOOM, "sample", runs, "--path", "2", "--prompt", "x"], env=env,
                       capture_output=True, text=True, timeout=120)
    check(r.returncode == 1 and "--path 2: expected auto or a path in [0, 2)" in r.stderr,
          "sample --path 2: exit %s: %s" % (r.returncode, r.stderr.strip()))
    r = run("dipaco", "eval", base)
    check(r.returncode == 1 and "path_0" in r.stderr,
          "eval of a run that is not DiPaCo: exit %s: %s" % (r.returncode, r.stderr.strip()))

print("dipaco: %s" % ("all passed" if failures == 0 else "%d FAILED" % failures))
sys.exit(1 if failures else 0)
