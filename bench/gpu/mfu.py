#!/usr/bin/env python3
"""Tokens/s, MFU and peak memory of one config's GPU runs, side by side, from their JSON.

    python3 bench/gpu/mfu.py C.toml NAME=R.json [NAME=R.json ...] [--peak-tflops 989]

Each R.json is `loom bench`'s output (step_ms, tokens_per_s, device_peak_bytes) or
bench/gpu/torch_step.py's (step_ms, tokens_per_s, peak_allocated). Model FLOPs per token are
counted as PaLM's appendix B and torchtitan count them: 6 per weight of every matmul (the output
head included, embedding lookups not) plus 12 * layers * d_model * seq for attention's scores and
weighted sum (forward and backward, the causal mask not discounted). MFU is that over the dense
bf16 peak of an H100/H200 SXM (989 TFLOP/s, the vendor's datasheet) unless --peak-tflops says
otherwise. Prints one JSON line per run and a markdown table.
"""
import json
import sys
import tomllib


def flops_per_token(m, seq):
    d, L, V = m["d_model"], m["n_layers"], m["vocab_size"]
    H = m["n_heads"]
    hd = d // H
    kv = m.get("n_kv_heads", H)
    F = m["ffn_hidden"]
    if m.get("arch", "llama") == "gpt2":
        per_layer = 4 * d * d + 2 * d * F
    else:
        per_layer = d * H * hd + 2 * d * kv * hd + H * hd * d + 3 * d * F
    matmul_weights = L * per_layer + V * d  # the head: tied or not, it is a matmul
    return 6 * matmul_weights + 12 * L * d * seq


def main(argv):
    peak = 989.0
    if "--peak-tflops" in argv:
        i = argv.index("--peak-tflops")
        peak = float(argv[i + 1])
        del argv[i:i + 2]
    if len(argv) < 2:
        sys.exit(__doc__)
    with open(argv[0], "rb") as f:
        cfg = tomllib.load(f)
    m, t = cfg["model"], cfg.get("train", {})
    seq = t.get("seq_len", 128)
    fpt = flops_per_token(m, seq)
    rows = []
    for arg in argv[1:]:
        name, _, path = arg.partition("=")
        try:
            with open(path) as f:
                r = json.load(f)
        except (OSError, ValueError) as e:
            print(json.dumps({"run": name, "error": str(e)}))
            continue
        tps = r.get("tokens_per_s")
        mem = r.get("device_peak_bytes", r.get("peak_allocated"))
        ms = r.get("step_ms")
        ms = ms.get("median") if isinstance(ms, dict) else ms  # loom bench: median, min, max
        row = {"run": name, "step_ms": ms, "tokens_per_s": tps,
               "tflops": tps * fpt / 1e12 if tps else None,
               "mfu": tps * fpt / (peak * 1e12) if tps else None, "peak_bytes": mem}
        rows.append(row)
        print(json.dumps(row))
    print(f"\n{argv[0]}: {fpt / 1e9:.2f} GFLOP per token (seq {seq}), peak {peak:g} TFLOP/s\n")
    print("| run | step ms | tokens/s | TFLOP/s | MFU | peak GPU memory |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        if r["tokens_per_s"] is None:
            continue
        mem = f"{r['peak_bytes'] / 1e9:.2f} GB" if r["peak_bytes"] else "-"
        print(f"| {r['run']} | {r['step_ms']:.2f} | {r['tokens_per_s']:,.0f} | {r['tflops']:.1f} | "
              f"{100 * r['mfu']:.1f}% | {mem} |")


if __name__ == "__main__":
    main(sys.argv[1:])
