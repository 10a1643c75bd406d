#!/usr/bin/env python3
"""loom sample on a tiny Llama trained briefly on one repeated sentence: greedy decoding is
deterministic, writes the prompt then exactly --max-tokens bytes, and continues the sentence, also
with a context so short that the key/value cache fills and is re-encoded several times; a seeded
sample is reproducible; a missing run dir is an error that names it.

    sample_test.py LOOM_BINARY SOURCE_DIR
"""
import os
import subprocess
import sys
import tempfile

LOOM, SRC = sys.argv[1], sys.argv[2]
CONFIG = os.path.join(SRC, "configs", "tiny-llama.toml")
PROMPT = "the cat"
N = 40
failures = 0


def check(ok, what, detail=""):
    global failures
    print("%-4s %s%s" % ("ok" if ok else "FAIL", what, (": " + detail) if detail and not ok else ""))
    if not ok:
        failures += 1


def sample(run, *extra):
    return subprocess.run([LOOM, "sample", run, "--prompt", PROMPT, "--max-tokens", str(N)]
                          + list(extra), env=env, capture_output=True)


# passive: a spinning OpenMP thread on cores shared with other jobs multiplies the runtime
env = dict(os.environ, OMP_NUM_THREADS="2", OMP_WAIT_POLICY="passive")
with tempfile.TemporaryDirectory() as d:
    data, run = os.path.join(d, "text.txt"), os.path.join(d, "run")
    with open(data, "w") as f:
        f.write("the cat sat on the mat. " * 2000)
    subprocess.run([LOOM, "train", CONFIG, "--run-dir", run, "--set", "data.path=" + data,
                    "--set", "train.steps=150", "--set", "train.warmup_steps=10",
                    "--set", "optim.lr=3e-3"], check=True, env=env, capture_output=True)

    a, b = sample(run, "--temperature", "0"), sample(run, "--temperature", "0")
    out = a.stdout.decode("utf-8", "replace")
    print("greedy: %r" % out)
    check(a.returncode == 0, "greedy exits 0", "rc %d: %s" % (a.returncode, a.stderr.decode()))
    check(a.stdout.startswith(PROMPT.encode()), "output starts with the prompt")
    check(len(a.stdout) == len(PROMPT) + N, "prompt + %d bytes" % N, "%d bytes" % len(a.stdout))
    check(a.stdout == b.stdout, "greedy is deterministic", "second run: %r" % b.stdout)
    rest = out[len(PROMPT):]
    check("sat" in rest or "mat" in rest, "the model continues the sentence", repr(rest))

    # a context of 12 fills the key/value cache after 5 new bytes: the newest 6 bytes are kept
    # and encoded again, several times over 40 bytes; the sentence still goes on
    w = sample(run, "--temperature", "0", "--context", "12")
    wout = w.stdout.decode("utf-8", "replace")
    print("greedy, context 12: %r" % wout)
    check(w.returncode == 0 and len(w.stdout) == len(PROMPT) + N,
          "context 12: prompt + %d bytes" % N, "rc %d: %s" % (w.returncode, w.stderr.decode()))
    check(wout[len(PROMPT):].count("at ") >= 3, "context 12: the sentence goes on", repr(wout))

    s1, s2 = sample(run, "--seed", "7"), sample(run, "--seed", "7")
    check(s1.returncode == 0 and len(s1.stdout) == len(PROMPT) + N, "seeded sample: prompt + %d "
          "bytes" % N, "rc %d, %d bytes" % (s1.returncode, len(s1.stdout)))
    check(s1.stdout == s2.stdout, "same seed, same sample")

    missing = os.path.join(d, "no-such-run")
    r = subprocess.run([LOOM, "sample", missing, "--prompt", PROMPT], env=env, capture_output=True,
                       text=True)
    check(r.returncode == 1 and missing in r.stderr, "missing run dir: exit 1 naming it",
          "rc %d: %s" % (r.returncode, r.stderr))

print("sample: all ok" if not failures else "sample: %d FAILED" % failures)
sys.exit(1 if failures else 0)
