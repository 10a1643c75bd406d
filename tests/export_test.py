#!/usr/bin/env python3
"""loom export writes a Hugging Face model directory that PyTorch reads back to the same loss, and
that `[model] init` starts a new run from.

    export_test.py LOOM_BINARY SOURCE_DIR

Per config (tiny-llama, tiny-gpt2, tiny-moe dropless as Mixtral): train 20 steps on generated text,
`loom export RUN --hf OUT`, then
  1. OUT/model.safetensors holds exactly the checkpoint's tensors (same names, shapes, bytes; a
     stacked expert weight as Mixtral's one tensor per expert);
  2. OUT/config.json builds bench/peer/torch_lm.py's model (so its keys and the weights agree:
     load_state_dict is strict), and PyTorch's loss on a fixed token batch equals `loom step`'s on
     the same weights and tokens within 1e-4 relative;
  3. `loom train --set model.init=OUT` (its config.json then decides [model]) logs a first loss below the original run's step-1 loss (same
     batch: the data order depends only on the seed and the step).
And bad input: a run dir without checkpoints, a missing --checkpoint, an init path that does not
exist or holds the other architecture's weights, an output directory holding an earlier model's file
the export would not replace: exit 1 with a message naming the path.

The driver is stdlib-only; step 2's PyTorch half runs this same file under /usr/bin/python3 (the
only interpreter that imports Debian's PyTorch) as `export_test.py --torch-loss OUT TOKENS`. A
missing PyTorch fails the test; it never skips.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

from safetensors_io import read_safetensors, write_tokens
from textdata import write_pseudo_english

TORCH_PYTHON = "/usr/bin/python3"
kRtol = 1e-4


# ----------------------------------------------------------------------------------------------
# The PyTorch half (under /usr/bin/python3): the exported directory -> the loss on TOKENS.


def torch_loss(out_dir, tokens_path, src):
    sys.path.insert(0, os.path.join(src, "tools"))
    import make_golden  # sets single-threaded BLAS before importing torch; has the reader
    import torch
    import torch_lm  # make_golden put bench/peer on sys.path

    with open(os.path.join(out_dir, "config.json")) as f:
        hf = json.load(f)
    if hf["model_type"] in ("llama", "mixtral"):
        moe = None
        if hf["model_type"] == "mixtral":  # Mixtral routes without capacity
            moe = torch_lm.MoeConfig(experts=hf["num_local_experts"],
                                     top_k=hf["num_experts_per_tok"], dropless=True)
        m = torch_lm.ModelConfig(moe=moe,
            arch="llama", vocab_size=hf["vocab_size"], d_model=hf["hidden_size"],
            n_layers=hf["num_hidden_layers"], n_heads=hf["num_attention_heads"],
            n_kv_heads=hf["num_key_value_heads"], ffn_hidden=hf["intermediate_size"],
            max_seq_len=hf["max_position_embeddings"], norm_eps=hf["rms_norm_eps"],
            rope_theta=hf["rope_theta"], dtype="f32",
            tie_embeddings=hf.get("tie_word_embeddings", False))
    else:
        m = torch_lm.ModelConfig(
            arch="gpt2", vocab_size=hf["vocab_size"], d_model=hf["n_embd"], n_layers=hf["n_layer"],
            n_heads=hf["n_head"], n_kv_heads=hf["n_head"], ffn_hidden=hf["n_inner"],
            max_seq_len=hf["n_positions"], norm_eps=hf["layer_norm_epsilon"], rope_theta=10000.0,
            dtype="f32")
    model = torch_lm.build_model(m)
    weights = make_golden.read_safetensors(os.path.join(out_dir, "model.safetensors"))
    # Mixtral's one tensor per expert -> the reference's stacked (E, ...) weights
    stacked = {}
    for name in list(weights):
        parts = name.split(".")
        if "experts" in parts and parts[parts.index("experts") + 1].isdigit():
            i = parts.index("experts")
            key = ".".join(parts[:i + 1] + parts[i + 2:])
            stacked.setdefault(key, {})[int(parts[i + 1])] = weights.pop(name)
    for key, per in stacked.items():
        weights[key] = torch.stack([per[e] for e in range(len(per))])
    model.load_state_dict(weights, strict=True)  # every name and shape, nothing extra
    tokens = make_golden.read_safetensors(tokens_path)["tokens"].long()
    with torch.no_grad():
        loss = torch_lm.lm_loss(model(tokens[:, :-1]), tokens[:, 1:])
    print(json.dumps({"loss": loss.item(), "params": sum(w.numel() for w in weights.values())}))


if len(sys.argv) == 5 and sys.argv[1] == "--torch-loss":
    torch_loss(sys.argv[2], sys.argv[3], sys.argv[4])
    sys.exit(0)


# ----------------------------------------------------------------------------------------------
# The driver.

LOOM, SRC = sys.argv[1], sys.argv[2]
ENV = dict(os.environ, OMP_NUM_THREADS="2")
failures = 0


def check(ok, what):
    global failures
    print("%-4s %s" % ("ok" if ok else "FAIL", what))
    if not ok:
        failures += 1
    return ok


def run(args):
    return subprocess.run(args, env=ENV, capture_output=True, text=True)


def run_ok(args):
    r = run(args)
    if r.returncode != 0:
        raise SystemExit("FAIL: %s exited %d\n%s%s" % (" ".join(args), r.returncode, r.stdout,
                                                         r.stderr))
    return r


def losses(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line)["loss"] for line in f]


def train_args(config, run_dir, data, steps, *extra):
    return [LOOM, "train", config, "--run-dir", run_dir, "--set", "data.path=" + data,
            "--set", "train.steps=%d" % steps, "--set", "train.eval_batches=1", *extra]


def expect_error(args, what, *needles):
    r = run(args)
    ok = r.returncode == 1 and all(n in r.stderr for n in needles)
    check(ok, "%s: exit %d, %s" % (what, r.returncode, r.stderr.strip().splitlines()[0]
                                   if r.stderr.strip() else "no message"))
    if not ok:
        print("     expected exit 1 naming %s; stderr:\n%s" % (needles, r.stderr))


EXPECTED_HF = {
    "llama": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
              "tie_word_embeddings": False, "torch_dtype": "float32"},
    "mixtral": {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
                "hidden_act": "silu", "num_local_experts": 4, "num_experts_per_tok": 2},
    "gpt2": {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
             "activation_function": "gelu_new", "tie_word_embeddings": True},
}

with tempfile.TemporaryDirectory() as d:
    data = os.path.join(d, "text.txt")
    write_pseudo_english(data)
    # A fixed batch, B = 3 rows of T+1 = 49 bytes of the text (T < both configs' max_seq_len).
    with open(data, "rb") as f:
        text = f.read()
    tokens = os.path.join(d, "tokens.safetensors")
    write_tokens(tokens, [list(text[o:o + 49]) for o in (0, 1000, 20000)])

    outs = {}
    # tiny-moe dropless: Mixtral routes without capacity, so the two losses agree only then
    moe_sets = ["--set", "model.moe={experts=4,top_k=2,dropless=true}"]
    for name in ["tiny-llama", "tiny-gpt2", "tiny-moe"]:
        config = os.path.join(SRC, "configs", name + ".toml")
        run_dir, out = os.path.join(d, "run-" + name), os.path.join(d, "hf-" + name)
        sets = moe_sets if name == "tiny-moe" else []
        run_ok(train_args(config, run_dir, data, 20, *sets))
        r = run_ok([LOOM, "export", run_dir, "--hf", out])
        outs[name] = out

        # 1. the exported tensors are the checkpoint's
        ckpt = os.path.join(run_dir, "checkpoints", "step_00000020", "model.safetensors")
        got, want = read_safetensors(os.path.join(out, "model.safetensors")), read_safetensors(ckpt)
        for key in [k for k in want if ".experts." in k]:  # stacked -> one tensor per expert
            dt, shape, raw = want.pop(key)
            size = len(raw) // shape[0]
            for e in range(shape[0]):
                want[key.replace(".experts.", ".experts.%d." % e)] = (
                    dt, shape[1:], raw[e * size:(e + 1) * size])
        check(got == want and all(v[0] == "F32" for v in got.values()),
              "%s: exported %d tensors, f32, equal to step 20's checkpoint" % (name, len(got)))
        check(sorted(os.listdir(out)) == ["config.json", "model.safetensors"],
              "%s: %s holds config.json and model.safetensors only" % (name, os.path.basename(out)))
        with open(os.path.join(out, "config.json")) as f:
            hf = json.load(f)
        arch = hf.get("model_type")
        fixed = EXPECTED_HF.get(arch, {})
        check(bool(fixed) and all(hf.get(k) == v for k, v in fixed.items())
              and "bos_token_id" not in hf and "eos_token_id" not in hf,
              "%s: config.json is a %s config" % (name, hf.get("architectures")))

        # 2. PyTorch on the exported directory == loom step on the same weights and tokens
        step_out = os.path.join(d, "step-" + name + ".safetensors")
        run_ok([LOOM, "step", "--config", os.path.join(run_dir, "config.toml"),
                "--weights", os.path.join(out, "model.safetensors"), "--tokens", tokens,
                "--out", step_out])
        dt, shape, raw = read_safetensors(step_out)["ce_loss"]  # = loss unless MoE
        loom_loss = struct.unpack("<f", raw)[0]
        r = subprocess.run([TORCH_PYTHON, os.path.abspath(__file__), "--torch-loss", out, tokens, SRC],
                           capture_output=True, text=True)
        if not check(r.returncode == 0, "%s: PyTorch loads the export (%s)" % (name, TORCH_PYTHON)):
            print(r.stderr)
            continue
        torch_res = json.loads(r.stdout.strip().splitlines()[-1])
        rel = abs(loom_loss - torch_res["loss"]) / abs(torch_res["loss"])
        check(rel <= kRtol, "%s: loss on 3x48 tokens: loom %.7f, PyTorch %.7f (rel %.1e <= %.0e)"
              % (name, loom_loss, torch_res["loss"], rel, kRtol))

        # 3. a new run from the exported weights starts where the old one ended, not at random init
        first = losses(run_dir)[0]
        # (Mixtral's config.json is not read back: the weights file, its tensors stacked again)
        init_from = out if name == "tiny-llama" else os.path.join(out, "model.safetensors")
        run2 = os.path.join(d, "init-" + name)
        run_ok(train_args(config, run2, data, 3, "--set", "model.init=" + init_from, *sets))
        again = losses(run2)[0]
        check(again < first, "%s: run from [model] init = %s: step-1 loss %.4f < %.4f (random init)"
              % (name, os.path.basename(init_from), again, first))

    # Bad input.
    llama = os.path.join(SRC, "configs", "tiny-llama.toml")
    bare = os.path.join(d, "bare-run")
    os.makedirs(bare)
    with open(os.path.join(d, "run-tiny-llama", "config.toml")) as f, \
            open(os.path.join(bare, "config.toml"), "w") as g:
        g.write(f.read())
    expect_error([LOOM, "export", bare, "--hf", os.path.join(d, "x")],
                 "export of a run dir without checkpoints", bare, "no checkpoints")
    check(not os.path.exists(os.path.join(d, "x")), "  ... and no output directory was created")
    # a model transformers has no class for is refused before anything is written
    moe_gpt2 = os.path.join(d, "run-moe-gpt2")
    run_ok(train_args(os.path.join(SRC, "configs", "tiny-moe-gpt2.toml"), moe_gpt2, data, 2))
    expect_error([LOOM, "export", moe_gpt2, "--hf", os.path.join(d, "x")],
                 "export of a GPT-2 with MoE layers", "no Hugging Face equivalent", "MoE layers")
    check(not os.path.exists(os.path.join(d, "x")), "  ... and no output directory was created")
    # a dense NormFormer Llama: LlamaForCausalLM would load it without its norms
    normformer = os.path.join(d, "run-normformer")
    run_ok(train_args(os.path.join(SRC, "configs", "tiny-normformer.toml"), normformer, data, 2))
    expect_error([LOOM, "export", normformer, "--hf", os.path.join(d, "x")],
                 "export of a dense NormFormer Llama", "no Hugging Face equivalent", "normformer")
    check(not os.path.exists(os.path.join(d, "x")), "  ... and no output directory was created")
    # an earlier model's file the export would not replace: refused before anything is written
    stale = os.path.join(d, "stale")
    os.makedirs(stale)
    open(os.path.join(stale, "tokenizer_config.json"), "w").write("{}")
    expect_error([LOOM, "export", os.path.join(d, "run-tiny-llama"), "--hf", stale],
                 "export into a directory holding an earlier model's tokenizer_config.json", stale,
                 "tokenizer_config.json", "would not replace")
    check(sorted(os.listdir(stale)) == ["tokenizer_config.json"], "  ... and nothing was written")
    # an earlier export of the same files is replaced
    r = run([LOOM, "export", os.path.join(d, "run-tiny-llama"), "--hf", outs["tiny-llama"]])
    check(r.returncode == 0, "export again into its own earlier export: replaced (%s)"
          % r.stderr.strip()[-200:])
    expect_error([LOOM, "export", os.path.join(d, "nowhere"), "--hf", os.path.join(d, "x")],
                 "export of a missing run dir", os.path.join(d, "nowhere"))
    missing = os.path.join(d, "run-tiny-llama", "checkpoints", "step_00000099")
    expect_error([LOOM, "export", os.path.join(d, "run-tiny-llama"), "--hf", os.path.join(d, "x"),
                  "--checkpoint", missing], "export --checkpoint of a missing checkpoint", missing)
    expect_error([LOOM, "export", os.path.join(d, "run-tiny-gpt2"), "--hf", os.path.join(d, "x"),
                  "--checkpoint", os.path.join(outs["tiny-llama"], "model.safetensors")],
                 "export --checkpoint of the other architecture's weights",
                 os.path.join(outs["tiny-llama"], "model.safetensors"), "missing tensor")
    expect_error(train_args(llama, os.path.join(d, "r1"), data, 3, "--set",
                            "model.init=" + os.path.join(d, "nowhere")),
                 "train with a missing [model] init", os.path.join(d, "nowhere"))
    # a Hugging Face directory's config.json decides the model: the other architecture's is caught
    # there, before any tensor is read; its bare weights file, at the first missing tensor
    expect_error(train_args(llama, os.path.join(d, "r2"), data, 3, "--set",
                            "model.init=" + outs["tiny-gpt2"]),
                 "train with [model] init of the other architecture's directory",
                 outs["tiny-gpt2"], "[model] arch = 'llama' disagrees with")
    gpt2_weights = os.path.join(outs["tiny-gpt2"], "model.safetensors")
    expect_error(train_args(llama, os.path.join(d, "r3"), data, 3, "--set",
                            "model.init=" + gpt2_weights),
                 "train with [model] init of the other architecture's weights file",
                 gpt2_weights, "missing tensor")

print("export: all ok" if not failures else "export: %d FAILED" % failures)
sys.exit(1 if failures else 0)
