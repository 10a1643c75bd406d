"""The sampling peer: transformers' generate() on a Hugging Face model directory, greedy, with its
KV cache (or without: --no-cache), on the given threads. Prints one JSON line: load and generate
seconds, tokens/s (new tokens over the whole generate() call, prompt included) and the text.

    hf_generate.py MODEL_DIR --prompt P [--max-new-tokens N] [--threads K] [--no-cache]
                   [--dtype f32|bf16]

Runs under the peer venv (bench/peer/setup_venv.sh). End-of-sequence does not stop it (Loom's
sample runs to --max-tokens too), so both produce the same number of tokens.
"""
import argparse
import json
import time

import torch
import transformers


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("--prompt", required=True)
    ap.add_argument("--max-new-tokens", type=int, default=80)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-cache", action="store_true")
    ap.add_argument("--dtype", choices=("f32", "bf16"), default="f32",
                    help="the dtype the model is loaded in (torch.float32 or torch.bfloat16)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    tok = transformers.AutoTokenizer.from_pretrained(args.model_dir, local_files_only=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        args.model_dir, dtype=torch.bfloat16 if args.dtype == "bf16" else torch.float32,
        local_files_only=True)
    model.eval()
    ids = tok(args.prompt, return_tensors="pt").input_ids
    t1 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=args.max_new_tokens,
                             min_new_tokens=args.max_new_tokens, use_cache=not args.no_cache,
                             pad_token_id=tok.eos_token_id)
    t2 = time.perf_counter()
    new = out[0, ids.shape[1]:]
    print(json.dumps({
        "peer": "transformers-generate" + ("-no-cache" if args.no_cache else ""),
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "threads": args.threads,
        "dtype": args.dtype,
        "prompt_tokens": int(ids.shape[1]),
        "new_tokens": int(new.shape[0]),
        "load_s": t1 - t0,
        "generate_s": t2 - t1,
        "tokens_per_s": int(new.shape[0]) / (t2 - t1),
        "text": tok.decode(new),
    }), flush=True)


if __name__ == "__main__":
    main()
