#!/usr/bin/env python3
"""Sampling speed: `loom sample` (its key/value cache) beside transformers' generate() (its KV
cache, and without it) on the same Hugging Face model directory, prompt, greedy decoding, number
of new tokens and threads, alternated ROUNDS times so they see the same machine load. Prints every
run's JSON line, then a summary line: medians, Loom's ratio to generate(), and whether the greedy
texts agree.

    bench/sample_bench.py [MODEL_DIR] [--rounds R] [--threads K] [--max-new-tokens N]
                          [--dtype f32|bf16]

--dtype bf16: Loom samples with `--dtype bf16` (its matmuls, attention and key/value cache in
bf16, the weights rounded to bf16 once) and transformers loads the model in torch.bfloat16. The
greedy texts of two bf16 programs need not agree (different summation orders round differently).

The memory-bandwidth floor: a new token reads every weight once (the tied embedding whole, as the
output head) in the sampling dtype, and the key/value cache so far; each round also measures the
machine's read bandwidth (bench/gemm_bench --stream 1, the same threads), and floor tokens/s =
bandwidth / bytes per token at the mean context of the generation. The summary gives Loom's time per
token after the first (decode_tokens_per_s) over the floor's: 1.0 is the floor.

MODEL_DIR defaults to SmolLM2-135M-Instruct as bench/smollm2.py writes it. The peer runs under the
peer venv (bench/peer/setup_venv.sh) with OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset; Loom keeps
the environment. Standard library only.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOOM = os.path.join(ROOT, "build", "release", "tools", "loom", "loom")
STREAM = os.path.join(ROOT, "build", "release", "bench", "gemm_bench")
PROMPT = ("<|im_start|>user\nWhat should I pack for a weekend hiking trip?<|im_end|>\n"
          "<|im_start|>assistant\n")


def last_json(text):
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise SystemExit("no JSON line in:\n" + text)


def bytes_per_token(model_dir, dtype, context):
    """Bytes one new token reads at `context` cached positions: every weight of model.safetensors
    in the sampling dtype (norm weights stay f32 and are too small to matter) and the key/value
    cache."""
    with open(os.path.join(model_dir, "model.safetensors"), "rb") as f:
        header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    params = 0
    for name, t in header.items():
        if name != "__metadata__":
            n = 1
            for d in t["shape"]:
                n *= d
            params += n
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    size = 2 if dtype == "bf16" else 4
    heads = cfg["num_attention_heads"]
    kv_dim = cfg.get("num_key_value_heads", heads) * cfg["hidden_size"] // heads
    return params * size + 2 * cfg["num_hidden_layers"] * context * kv_dim * size


def main():
    home = os.path.expanduser("~")
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir", nargs="?", default=os.path.join(home, ".cache/loom/smollm2"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=80)
    ap.add_argument("--dtype", choices=("f32", "bf16"), default="f32")
    args = ap.parse_args()
    venv = os.environ.get("LOOM_PEER_VENV", os.path.join(home, ".cache/loom/peer-venv"))
    python = os.path.join(venv, "bin", "python")
    for path, how in ((LOOM, "build first: scripts/setup.sh"),
                      (STREAM, "build first: scripts/setup.sh"),
                      (python, "make the peer venv: bench/peer/setup_venv.sh"),
                      (os.path.join(args.model_dir, "config.json"), "bench/smollm2.py makes it")):
        if not os.path.exists(path):
            raise SystemExit("sample_bench: %s is missing (%s)" % (path, how))
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    peer_env = {k: v for k, v in env.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    peer = [python, os.path.join(ROOT, "bench/peer/hf_generate.py"), args.model_dir, "--prompt",
            PROMPT, "--max-new-tokens", str(args.max_new_tokens), "--threads", str(args.threads),
            "--dtype", args.dtype]
    runs = {}
    bandwidth = []
    for _ in range(args.rounds):
        r = subprocess.run([STREAM, "--stream", "1", "--threads", str(args.threads)], env=env,
                           capture_output=True, text=True, check=True)
        bandwidth.append(last_json(r.stdout)["gb_s"])
        print(r.stdout.strip(), flush=True)
        r = subprocess.run([LOOM, "sample", args.model_dir, "--prompt", PROMPT, "--max-tokens",
                            str(args.max_new_tokens), "--temperature", "0", "--stats",
                            "--dtype", args.dtype,
                            "--ignore-eos"],  # as the peer's min_new_tokens: the same count
                           env=env, capture_output=True, text=True, check=True)
        d = dict(last_json(r.stderr), program="loom", threads=args.threads,
                 text=r.stdout[len(PROMPT):])
        print(json.dumps(d), flush=True)
        runs.setdefault("loom", []).append(d)
        for extra in ([], ["--no-cache"]):
            r = subprocess.run(peer + extra, env=peer_env, capture_output=True, text=True,
                               check=True)
            d = last_json(r.stdout)
            d["program"] = d["peer"]
            print(json.dumps(d), flush=True)
            runs.setdefault(d["program"], []).append(d)
    summary = {name: {"runs": len(ds),
                      "tokens_per_s_median": statistics.median(d["tokens_per_s"] for d in ds),
                      "load_s_median": statistics.median(d["load_s"] for d in ds)}
               for name, ds in runs.items()}
    gen = summary["transformers-generate"]["tokens_per_s_median"]
    summary["loom"]["speed_vs_generate"] = summary["loom"]["tokens_per_s_median"] / gen
    same = runs["loom"][0]["text"] == runs["transformers-generate"][0]["text"]
    # the floor at the generation's mean context (prompt + half the new tokens)
    loom0 = runs["loom"][0]
    per_token = bytes_per_token(args.model_dir, args.dtype,
                                loom0["prompt_tokens"] + args.max_new_tokens / 2)
    gb_s = statistics.median(bandwidth)
    floor = gb_s * 1e9 / per_token
    decode = statistics.median(d["decode_tokens_per_s"] for d in runs["loom"])
    summary["loom"]["decode_tokens_per_s_median"] = decode
    summary["floor"] = {"bandwidth_gb_s_median": gb_s, "bandwidth_gb_s_range": [min(bandwidth), max(bandwidth)],
                        "bytes_per_token": per_token, "tokens_per_s": floor,
                        "loom_time_per_token_vs_floor": floor / decode}
    print(json.dumps({"summary": summary, "greedy_texts_equal": same,
                      "prompt_tokens": runs["loom"][0]["prompt_tokens"],
                      "new_tokens": args.max_new_tokens, "threads": args.threads,
                      "dtype": args.dtype}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
