#!/usr/bin/env python3
"""Hugging Face `transformers` as a client of `loom export --hf`: the directory loads with no missing,
unexpected or mismatched key, and transformers' logits on the same tokens equal Loom's.

    hf_client_test.py LOOM_BINARY SOURCE_DIR

Per config (the benchmark models, bench-llama and bench-gpt2, and the tiny ones): train 2 steps on
generated text, `loom export RUN --hf OUT`, then
  1. AutoModelForCausalLM.from_pretrained(OUT, dtype=torch.float32, attn_implementation="eager",
     local_files_only=True) reports no missing, unexpected or mismatched keys;
  2. its logits on a fixed token batch equal `loom step --logits` on the same weights and tokens:
     max |loom - transformers| <= 1e-5 * max |transformers| (f32), and the loss within 1e-5.

The driver is stdlib-only; the transformers half runs this same file under the peer venv's python
(bench/peer/setup_venv.sh; $LOOM_PEER_VENV) as `hf_client_test.py --transformers OUT TOKENS`. The
test is labelled `peer`, outside the default run, because the venv is a 3-4 GB download; run it
with `ctest -L peer`. A missing venv fails the test; it never skips.
"""
import json
import os
import subprocess
import sys
import tempfile

from peer_env import ENV, VENV_PYTHON, check, checks, require_venv, run, transformers_on
from safetensors_io import floats, read_safetensors, write_tokens
from textdata import write_pseudo_english

kRtol = 1e-5


# ----------------------------------------------------------------------------------------------
# The transformers half (under the peer venv): the exported directory -> loading info, logits.


def transformers_logits(out_dir, tokens_path, logits_path):
    from safetensors.torch import save_file

    model, info, logits, loss = transformers_on(out_dir, tokens_path)
    save_file({"logits": logits.contiguous()}, logits_path)
    print(json.dumps({
        "class": type(model).__name__,
        "missing": sorted(info.get("missing_keys", [])),
        "unexpected": sorted(info.get("unexpected_keys", [])),
        "mismatched": [str(m) for m in info.get("mismatched_keys", [])],
        "loss": loss,
        "transformers": __import__("transformers").__version__,
        "torch": __import__("torch").__version__,
    }))


if len(sys.argv) == 5 and sys.argv[1] == "--transformers":
    transformers_logits(sys.argv[2], sys.argv[3], sys.argv[4])
    sys.exit(0)


# ----------------------------------------------------------------------------------------------
# The driver.

LOOM, SRC = sys.argv[1], sys.argv[2]
require_venv()

with tempfile.TemporaryDirectory() as d:
    data = os.path.join(d, "text.txt")
    write_pseudo_english(data)
    with open(data, "rb") as f:
        text = f.read()
    tokens = os.path.join(d, "tokens.safetensors")
    write_tokens(tokens, [list(text[o:o + 65]) for o in (0, 1000, 20000)])  # B = 3, T = 64

    for name in ["bench-llama", "bench-gpt2", "tiny-llama", "tiny-llama-tied", "tiny-gpt2"]:
        config = os.path.join(SRC, "configs", name + ".toml")
        run_dir, out = os.path.join(d, "run-" + name), os.path.join(d, "hf-" + name)
        run([LOOM, "train", config, "--run-dir", run_dir, "--set", "data.path=" + data,
             "--set", "train.steps=2", "--set", "train.eval_batches=1",
             "--set", "train.batch_size=2", "--set", "train.seq_len=64"])
        run([LOOM, "export", run_dir, "--hf", out])
        step_out = os.path.join(d, "step-" + name + ".safetensors")
        run([LOOM, "step", "--config", os.path.join(run_dir, "config.toml"), "--weights",
             os.path.join(out, "model.safetensors"), "--tokens", tokens, "--out", step_out,
             "--logits"])
        loom = read_safetensors(step_out)
        loom_loss = floats(loom["loss"][2])[0]
        loom_logits = floats(loom["logits"][2])

        theirs = os.path.join(d, "hf-logits-" + name + ".safetensors")
        r = subprocess.run([VENV_PYTHON, os.path.abspath(__file__), "--transformers", out, tokens,
                            theirs], capture_output=True, text=True, env=ENV)
        if not check(r.returncode == 0, "%s: transformers loads the export" % name):
            print(r.stderr[-3000:])
            continue
        res = json.loads(r.stdout.strip().splitlines()[-1])
        check(not res["missing"] and not res["unexpected"] and not res["mismatched"],
              "%s: %s (transformers %s) loads with no missing, unexpected or mismatched key%s"
              % (name, res["class"], res["transformers"],
                 "" if not (res["missing"] or res["unexpected"] or res["mismatched"])
                 else ": missing %s, unexpected %s, mismatched %s"
                 % (res["missing"][:5], res["unexpected"][:5], res["mismatched"][:5])))
        hf = read_safetensors(theirs)["logits"]
        hf_logits = floats(hf[2])
        if not check(hf[1] == loom["logits"][1], "%s: logits shape %s (loom %s)"
                     % (name, hf[1], loom["logits"][1])):
            continue
        scale = max(abs(x) for x in hf_logits)
        worst = max(abs(a - b) for a, b in zip(loom_logits, hf_logits))
        check(worst <= kRtol * scale, "%s: logits max |loom - transformers| = %.2e, %.1e of max |logit| "
              "%.3f (<= %.0e)" % (name, worst, worst / scale, scale, kRtol))
        rel = abs(loom_loss - res["loss"]) / abs(res["loss"])
        check(rel <= kRtol, "%s: loss loom %.7f, transformers %.7f (rel %.1e <= %.0e)"
              % (name, loom_loss, res["loss"], rel, kRtol))

checks.finish()
