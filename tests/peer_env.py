"""What the tests labelled `peer` share: the peer venv (bench/peer/setup_venv.sh; $LOOM_PEER_VENV),
the SmolLM2 directory and the corpus they read, the driver's tally and command runner (2 OpenMP
threads), and the transformers side (run under the venv's python). A missing venv fails the test;
it never skips."""
import os
import sys

from checks import Checks, run_ok

VENV = os.environ.get("LOOM_PEER_VENV", os.path.expanduser("~/.cache/loom/peer-venv"))
VENV_PYTHON = os.path.join(VENV, "bin", "python")
SMOLLM2 = os.environ.get("LOOM_SMOLLM2", os.path.join(os.path.dirname(VENV), "smollm2"))
ENV = dict(os.environ, OMP_NUM_THREADS="2")
checks = Checks()


def check(ok, what):
    """One line of the tally; returns `ok`."""
    checks.check(what, ok)
    return ok


def run(args):
    """Runs a command with 2 OpenMP threads; a non-zero exit ends the test with its output."""
    return run_ok(args, env=ENV)


def require_venv():
    if not os.access(VENV_PYTHON, os.X_OK):
        print("FAIL: no peer venv at %s (bench/peer/setup_venv.sh makes it, or set LOOM_PEER_VENV)"
              % VENV)
        sys.exit(1)


def smollm2_dir(src):
    """SmolLM2-135M-Instruct's Hugging Face directory, made by bench/smollm2.py when absent."""
    if not all(os.path.exists(os.path.join(SMOLLM2, f)) for f in ("config.json", "tokenizer.json")):
        run([VENV_PYTHON, os.path.join(src, "bench", "smollm2.py"), SMOLLM2])
    return SMOLLM2


def corpus_dir(src):
    """The default corpus (scripts/fetch_corpus.sh; does nothing when it is complete)."""
    corpus = os.path.join(src, "data", "gutenberg")
    run(["bash", os.path.join(src, "scripts", "fetch_corpus.sh"), corpus])
    return corpus


def transformers_on(model_dir, tokens_path):
    """Under the venv: the model in `model_dir` as transformers loads it (f32, eager attention, local
    files only), its loading info, and its logits (B,T,V) and Loom's loss (the mean cross-entropy
    against tokens[:, 1:]) on the i32 tokens [B, T+1] in `tokens_path`."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(2)
    model, info = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager", local_files_only=True,
        output_loading_info=True)
    tokens = load_file(tokens_path)["tokens"].long()
    with torch.no_grad():
        logits = model(tokens[:, :-1]).logits.float()
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                             tokens[:, 1:].reshape(-1))
    return model, info, logits, loss.item()
