#!/usr/bin/env python3
"""Sampling speed: `loom sample` (its key/value cache) beside transformers' generate() (its KV
cache, and without it) on the same Hugging Face model directory, prompt, greedy decoding, number
of new tokens and threads, alternated ROUNDS times so they see the same machine load. Prints every
run's JSON line, then a summary line: medians, Loom's ratio to generate(), and whether the greedy
texts agree.

    bench/sample_bench.py [MODEL_DIR] [--rounds R] [--threads K] [--max-new-tokens N]

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
PROMPT = ("<|im_start|>user\nWhat should I pack for a weekend hiking trip?<|im_end|>\n"
          "<|im_start|>assistant\n")


def last_json(text):
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise SystemExit("no JSON line in:\n" + text)


def main():
    home = os.path.expanduser("~")
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir", nargs="?", default=os.path.join(home, ".cache/loom/smollm2"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=80)
    args = ap.parse_args()
    venv = os.environ.get("LOOM_PEER_VENV", os.path.join(home, ".cache/loom/peer-venv"))
    python = os.path.join(venv, "bin", "python")
    for path, how in ((LOOM, "build first: scripts/setup.sh"),
                      (python, "make the peer venv: bench/peer/setup_venv.sh"),
                      (os.path.join(args.model_dir, "config.json"), "bench/smollm2.py makes it")):
        if not os.path.exists(path):
            raise SystemExit("sample_bench: %s is missing (%s)" % (path, how))
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    peer_env = {k: v for k, v in env.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    peer = [python, os.path.join(ROOT, "bench/peer/hf_generate.py"), args.model_dir, "--prompt",
            PROMPT, "--max-new-tokens", str(args.max_new_tokens), "--threads", str(args.threads)]
    runs = {}
    for _ in range(args.rounds):
        r = subprocess.run([LOOM, "sample", args.model_dir, "--prompt", PROMPT, "--max-tokens",
                            str(args.max_new_tokens), "--temperature", "0", "--stats",
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
    print(json.dumps({"summary": summary, "greedy_texts_equal": same,
                      "prompt_tokens": runs["loom"][0]["prompt_tokens"],
                      "new_tokens": args.max_new_tokens, "threads": args.threads}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
