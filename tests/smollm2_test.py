#!/usr/bin/env python3
"""A real pretrained model end to end: SmolLM2-135M-Instruct (bench/smollm2.py makes its Hugging
Face directory) read by Loom, fine-tuned by Loom, and read back by transformers.

    smollm2_test.py LOOM_BINARY SOURCE_DIR

  1. Loom's loss on 4 x 256 tokens of a held-out Gutenberg book (chesterton-brown.txt, the corpus's
     validation book) equals transformers' within 1e-4 relative (`loom step` with [model] init = the
     directory, whose config.json decides the model: tied embeddings, 3:1 grouped-query attention,
     rope_theta 100000).
  2. `loom data prepare --tokenizer DIR` on the corpus, then `loom train` from the directory for a
     few steps, `loom export --hf`: on the same held-out tokens Loom's loss falls, and transformers
     loads the export (no missing or unexpected key) with the same loss as Loom reports.
  3. The export keeps the source's tokenizer_config.json, chat template, generation defaults and
     max_position_embeddings, and a chat with it (`loom sample --chat`, greedy) gives transformers'
     apply_chat_template + generate reply, both ending at the end-of-turn token.

The transformers half runs this file under the peer venv's python (`--transformers DIR TOKENS`).
Labelled peer; a missing venv fails the test, never skips. About 5 minutes on 2 cores.
"""
import json
import os
import subprocess
import sys
import tempfile

from peer_env import (ENV, VENV_PYTHON, check, checks, corpus_dir, require_venv, run, smollm2_dir,
                      transformers_on)
from safetensors_io import floats, read_safetensors

kRtol = 1e-4
B, T = 4, 256


def transformers_loss(model_dir, tokens_path):
    _, info, _, loss = transformers_on(model_dir, tokens_path)
    print(json.dumps({"loss": loss, "missing": sorted(info.get("missing_keys", [])),
                      "unexpected": sorted(info.get("unexpected_keys", []))}))


def held_out_tokens(tokenizer_json, book, out):
    """B rows of T+1 tokens from the middle of `book`, encoded by `tokenizers`."""
    from safetensors.torch import save_file
    from tokenizers import Tokenizer
    import torch

    text = open(book, encoding="utf-8").read()
    ids = Tokenizer.from_file(tokenizer_json).encode(text, add_special_tokens=False).ids
    start = len(ids) // 2
    rows = [ids[start + r * (T + 1):start + (r + 1) * (T + 1)] for r in range(B)]
    save_file({"tokens": torch.tensor(rows, dtype=torch.int32)}, out)


def transformers_chat(model_dir, message, max_new):
    """transformers' greedy reply to one user message through the directory's chat template."""
    import warnings
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                 attn_implementation="eager", local_files_only=True)
    ids = tok.apply_chat_template([{"role": "user", "content": message}], add_generation_prompt=True,
                                  return_tensors="pt")
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=max_new, do_sample=False)
    new = out[0, ids.shape[1]:].tolist()
    eos = model.generation_config.eos_token_id
    eos = eos if isinstance(eos, list) else [eos]
    print(json.dumps({"reply": tok.decode(new, skip_special_tokens=True),
                      "ended": bool(new) and new[-1] in eos, "eos_token": tok.eos_token,
                      "warnings": [str(w.message) for w in caught
                                   if "special" in str(w.message).lower()]}))


if len(sys.argv) == 4 and sys.argv[1] == "--transformers":
    transformers_loss(sys.argv[2], sys.argv[3])
    sys.exit(0)
if len(sys.argv) == 5 and sys.argv[1] == "--chat":
    transformers_chat(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    sys.exit(0)
if len(sys.argv) == 5 and sys.argv[1] == "--tokens":
    held_out_tokens(sys.argv[2], sys.argv[3], sys.argv[4])
    sys.exit(0)

LOOM, SRC = sys.argv[1], sys.argv[2]


def loom_loss(config, weights, tokens, d):
    out = os.path.join(d, "step.safetensors")
    run([LOOM, "step", "--config", config, "--weights", weights, "--tokens", tokens, "--out", out])
    return floats(read_safetensors(out)["loss"][2])[0]


def hf_loss(model_dir, tokens):
    return json.loads(run([VENV_PYTHON, os.path.abspath(__file__), "--transformers", model_dir,
                           tokens]).strip().splitlines()[-1])


require_venv()
SMOLLM2 = smollm2_dir(SRC)
corpus = corpus_dir(SRC)

with tempfile.TemporaryDirectory() as d:
    tokens = os.path.join(d, "held_out.safetensors")
    run([VENV_PYTHON, os.path.abspath(__file__), "--tokens", os.path.join(SMOLLM2, "tokenizer.json"),
         os.path.join(corpus, "chesterton-brown.txt"), tokens])
    # a config that names only the directory: its config.json decides [model]
    config = os.path.join(d, "smollm2.toml")
    with open(config, "w") as f:
        f.write('[model]\ninit = "%s"\nmax_seq_len = %d\n\n[train]\nbatch_size = 4\nseq_len = %d\n'
                'steps = 12\nwarmup_steps = 2\neval_every = 12\neval_batches = 4\n\n[optim]\n'
                'lr = 5e-5\nweight_decay = 0.0\n\n[data]\npath = "%s"\n'
                % (SMOLLM2, T, T, os.path.join(d, "data")))

    # 1. the pretrained model: Loom's loss == transformers'
    base = loom_loss(config, SMOLLM2, tokens, d)
    hf = hf_loss(SMOLLM2, tokens)
    rel = abs(base - hf["loss"]) / hf["loss"]
    check(rel <= kRtol, "SmolLM2 on %dx%d held-out tokens: loom %.6f, transformers %.6f (rel %.1e "
          "<= %.0e)" % (B, T, base, hf["loss"], rel, kRtol))

    # 2. fine-tune on the corpus with its own tokenizer, export, read back
    run([LOOM, "data", "prepare", "--input", corpus, "--out", os.path.join(d, "data"),
         "--tokenizer", SMOLLM2])
    run_dir = os.path.join(d, "run")
    run([LOOM, "train", config, "--run-dir", run_dir])
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        metrics = [json.loads(line) for line in f]
    print("     train loss: step 1 %.4f, step %d %.4f; val loss %s" % (
        metrics[0]["loss"], len(metrics), metrics[-1]["loss"], metrics[-1].get("val_loss")))
    export = os.path.join(d, "export")
    run([LOOM, "export", run_dir, "--hf", export])
    check(os.path.exists(os.path.join(export, "tokenizer.json")),
          "the export carries the run's tokenizer.json")
    prompt = "The capital of France is"
    said = run([LOOM, "sample", export, "--prompt", prompt, "--max-tokens", "8", "--temperature",
                "0"])
    check(said.startswith(prompt) and len(said) > len(prompt) + 4,
          "loom sample on the export continues the prompt: %r" % said)
    # 3. the export keeps what the source gave: special tokens, chat template, generation defaults,
    # the context length it was made for; a chat with it ends at the end-of-turn token, as
    # transformers' generate on the same directory does, with the same greedy reply
    cfg_out = json.load(open(os.path.join(export, "config.json")))
    check(all(os.path.exists(os.path.join(export, f)) for f in
              ("tokenizer_config.json", "generation_config.json", "chat_template.jinja"))
          and cfg_out.get("max_position_embeddings") == 8192,
          "the export carries tokenizer_config.json, generation_config.json, the chat template and "
          "the source's max_position_embeddings (8192, not the run's %d): %s"
          % (T, cfg_out.get("max_position_embeddings")))
    message, max_new = "What is the capital of France?", 48
    r = subprocess.run([LOOM, "sample", export, "--chat", message, "--temperature", "0",
                        "--max-tokens", str(max_new), "--stats"], env=ENV, capture_output=True,
                       text=True)
    stats = json.loads(r.stderr.strip().splitlines()[-1]) if r.returncode == 0 else {}
    theirs = json.loads(run([VENV_PYTHON, os.path.abspath(__file__), "--chat", export, message,
                             str(max_new)]).strip().splitlines()[-1])
    check(r.returncode == 0 and r.stdout == theirs["reply"] and stats.get("stopped") == "stop_id"
          and theirs["ended"],
          "a chat with the export: loom sample --chat and transformers' apply_chat_template + "
          "generate give the same greedy reply, both ended by the end-of-turn token: loom %r "
          "(stopped %s), transformers %r (ended %s)%s" % (r.stdout, stats.get("stopped"),
                                                         theirs["reply"], theirs["ended"],
                                                         r.stderr[-500:] if r.returncode else ""))
    check(theirs["eos_token"] == "<|im_end|>" and not theirs["warnings"],
          "transformers reads the export's special tokens (eos %r), no warning about missing ones "
          "%s" % (theirs["eos_token"], theirs["warnings"][:2]))
    tuned = loom_loss(config, export, tokens, d)
    check(tuned < base, "fine-tuned: held-out loss %.6f < %.6f before" % (tuned, base))
    hf2 = hf_loss(export, tokens)
    check(not hf2["missing"] and not hf2["unexpected"],
          "transformers loads the fine-tuned export (missing %s, unexpected %s)"
          % (hf2["missing"][:3], hf2["unexpected"][:3]))
    rel = abs(tuned - hf2["loss"]) / hf2["loss"]
    check(rel <= kRtol, "fine-tuned: loom %.6f, transformers %.6f (rel %.1e <= %.0e)"
          % (tuned, hf2["loss"], rel, kRtol))

checks.finish()
