#!/usr/bin/env python3
"""One GPU's training step of a Loom Llama or GPT-2 config, in eager PyTorch as torchtitan writes it.

    python3 bench/gpu/torch_step.py C.toml [--layers N] [--batch B] [--seq T]
        [--ac none|selective|titan] [--steps 8] [--warmup 3] [--out R.json] [--device cuda]
        [--compile]

The model is the config's [model] (arch = "llama" or "gpt2"; tie_embeddings honoured), its weights bf16 for compute beside f32
masters, as FSDP2's mixed precision keeps them (param_dtype bf16, reduce_dtype f32): a step is the
forward and backward in bf16, the gradients cast to f32, clip_grad_norm_ (foreach), fused AdamW
on the masters and a copy back to bf16. No communication: this is what one rank computes.

--ac: none; selective (Loom's `passes.recompute = "selective"`: every matmul's and attention's
output saved, the rest recomputed in the backward); titan (torchtitan's "op" policy, as its
published Llama 3.1 runs used: the same, except every second matmul is recomputed too). Needs
PyTorch >= 2.4 for selective and titan.

Prints and writes (--out) one JSON object: the median step time and tokens/s over --steps timed
steps after --warmup, each step's time, the peak memory PyTorch's allocator reported, and the
shape run. The model code is written here for this measurement, after the structure of
torchtitan's Llama (RMSNorm, RoPE by complex multiplication, repeat_kv, SDPA, SwiGLU); GPT-2 as
llm.c's PyTorch reference has it (learned positions, LayerNorm, fused qkv, SDPA, tanh GELU, the
head tied to the embedding). --ac applies to Llama only.
"""
import argparse
import contextlib
import json
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, __file__.rsplit("/", 1)[0])
# the same attention, RMSNorm and RoPE the kernel timings use
from torch_kernels import apply_rope, attention, rms, rope_freqs  # noqa: E402

try:
    import tomllib
except ImportError:  # Python < 3.11
    tomllib = None


class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return rms(x, self.weight, self.eps)


class Block(nn.Module):
    def __init__(self, m):
        super().__init__()
        d, H, Hkv = m["d_model"], m["n_heads"], m.get("n_kv_heads", m["n_heads"])
        self.H, self.Hkv, self.D = H, Hkv, d // H
        self.wq = nn.Linear(d, H * self.D, bias=False)
        self.wk = nn.Linear(d, Hkv * self.D, bias=False)
        self.wv = nn.Linear(d, Hkv * self.D, bias=False)
        self.wo = nn.Linear(H * self.D, d, bias=False)
        f = m["ffn_hidden"]
        self.w1 = nn.Linear(d, f, bias=False)
        self.w3 = nn.Linear(d, f, bias=False)
        self.w2 = nn.Linear(f, d, bias=False)
        self.attention_norm = RMSNorm(d, m.get("norm_eps", 1e-5))
        self.ffn_norm = RMSNorm(d, m.get("norm_eps", 1e-5))

    def forward(self, x, freqs):
        B, T, _ = x.shape
        h = self.attention_norm(x)
        q = apply_rope(self.wq(h).view(B, T, self.H, self.D), freqs)
        k = apply_rope(self.wk(h).view(B, T, self.Hkv, self.D), freqs)
        v = self.wv(h).view(B, T, self.Hkv, self.D)
        x = x + self.wo(attention(q, k, v, self.D ** -0.5).view(B, T, -1))
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Llama(nn.Module):
    def __init__(self, m, ac):
        super().__init__()
        self.m, self.ac = m, ac
        self.tok_embeddings = nn.Embedding(m["vocab_size"], m["d_model"])
        self.layers = nn.ModuleList(Block(m) for _ in range(m["n_layers"]))
        self.norm = RMSNorm(m["d_model"], m.get("norm_eps", 1e-5))
        self.output = nn.Linear(m["d_model"], m["vocab_size"], bias=False)
        if m.get("tie_embeddings", False):
            self.output.weight = self.tok_embeddings.weight

    def forward(self, tokens, freqs):
        x = self.tok_embeddings(tokens)
        for layer in self.layers:
            if self.ac == "none":
                x = layer(x, freqs)
            else:
                from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts
                # a fresh policy (and matmul count) per layer and step, as torchtitan's
                def ctx():
                    return create_selective_checkpoint_contexts(policy(self.ac))
                x = checkpoint(layer, x, freqs, use_reentrant=False, context_fn=ctx)
        return self.output(self.norm(x))


class GPT2Block(nn.Module):
    def __init__(self, m):
        super().__init__()
        d, self.H = m["d_model"], m["n_heads"]
        self.D = d // self.H
        eps = m.get("norm_eps", 1e-5)
        self.ln_1, self.ln_2 = nn.LayerNorm(d, eps=eps), nn.LayerNorm(d, eps=eps)
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.c_fc, self.mlp_proj = nn.Linear(d, m["ffn_hidden"]), nn.Linear(m["ffn_hidden"], d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        shape = (B, T, self.H, self.D)
        y = attention(q.view(shape), k.view(shape), v.view(shape), self.D ** -0.5)
        x = x + self.c_proj(y.reshape(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, m):
        super().__init__()
        d = m["d_model"]
        self.wte = nn.Embedding(m["vocab_size"], d)
        self.wpe = nn.Embedding(m["max_seq_len"], d)
        self.h = nn.ModuleList(GPT2Block(m) for _ in range(m["n_layers"]))
        self.ln_f = nn.LayerNorm(d, eps=m.get("norm_eps", 1e-5))
        self.lm_head = nn.Linear(d, m["vocab_size"], bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as GPT-2 is

    def forward(self, tokens, freqs=None):
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.wte(tokens) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def policy(ac):
    """Save matmul and attention outputs; under "titan" every second matmul is recomputed."""
    from torch.utils.checkpoint import CheckpointPolicy
    ops = torch.ops.aten
    save = {ops.mm.default, ops._scaled_dot_product_flash_attention.default,
            ops._scaled_dot_product_efficient_attention.default}
    for name in ("_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu"):
        if hasattr(ops, name):
            save.add(getattr(ops, name).default)
    count = {"forward": 0, "recompute": 0}

    def fn(ctx, func, *args, **kwargs):
        mode = "recompute" if ctx.is_recompute else "forward"
        if func == ops.mm.default:
            count[mode] += 1
            if ac == "titan" and count[mode] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if func in save else CheckpointPolicy.PREFER_RECOMPUTE

    return fn


def load_model(path, a):
    if tomllib is None:
        sys.exit("torch_step.py: needs Python >= 3.11 (tomllib)")
    try:
        with open(path, "rb") as f:
            cfg = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        sys.exit(f"torch_step.py: {path}: {e}")
    m = dict(cfg.get("model", {}))
    if m.get("arch", "llama") not in ("llama", "gpt2"):
        sys.exit(f"torch_step.py: {path}: model.arch: only llama and gpt2 are written here")
    for key in ("vocab_size", "d_model", "n_layers", "n_heads", "ffn_hidden"):
        if key not in m:
            sys.exit(f"torch_step.py: {path}: model.{key}: missing")
    if a.layers:
        m["n_layers"] = a.layers
    t = cfg.get("train", {})
    return m, a.batch or t.get("batch_size", 1), a.seq or t.get("seq_len", 128)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config")
    ap.add_argument("--layers", type=int, default=0)
    ap.add_argument("--batch", type=int, default=0)
    ap.add_argument("--seq", type=int, default=0)
    ap.add_argument("--ac", choices=["none", "selective", "titan"], default="selective")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--out")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--compile", action="store_true",
                    help="the model under torch.compile (its compile time falls in the warm-up)")
    a = ap.parse_args(argv)
    m, B, T = load_model(a.config, a)
    device = torch.device(a.device)
    torch.manual_seed(0)
    # built on the device (PyTorch >= 2.0): no host-side initialisation of billions of weights
    with device if hasattr(torch.device, "__enter__") else contextlib.nullcontext():
        gpt2 = m.get("arch", "llama") == "gpt2"
        model = (GPT2(m) if gpt2 else Llama(m, a.ac)).to(device)
    masters = [p.detach().clone().float() for p in model.parameters()]
    model.to(torch.bfloat16)
    params = list(model.parameters())
    fwd = torch.compile(model) if a.compile else model
    fused = device.type == "cuda"
    opt = torch.optim.AdamW(masters, lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            **({"fused": True} if fused else {}))
    foreach = {"foreach": True} if torch.__version__ >= "2" else {}  # 1.13: a CPU test
    freqs = None if gpt2 else rope_freqs(T, m["d_model"] // m["n_heads"],
                                         m.get("rope_theta", 10000.0), device)
    tokens = torch.randint(0, m["vocab_size"], (B, T + 1), device=device)

    def step():
        for p in params:
            p.grad = None
        logits = fwd(tokens[:, :-1], freqs)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
        loss.backward()
        for mp, p in zip(masters, params):
            mp.grad = p.grad.float()
        torch.nn.utils.clip_grad_norm_(masters, 1.0, **foreach)
        opt.step()
        with torch.no_grad():
            for p, mp in zip(params, masters):
                p.copy_(mp)
        return loss

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    for _ in range(a.warmup):
        step()
    sync()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        loss = step()
        sync()
        times.append(time.perf_counter() - t0)
    med = statistics.median(times)
    r = {"config": a.config, "arch": m.get("arch", "llama"), "layers": m["n_layers"],
         "params": sum(p.numel() for p in params), "batch": B, "seq": T, "ac": a.ac,
         "mode": "compile" if a.compile else "eager",
         "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
         "torch": torch.__version__, "step_ms": med * 1e3, "steps_ms": [t * 1e3 for t in times],
         "tokens_per_s": B * T / med, "loss": float(loss.detach())}
    if device.type == "cuda":
        r["peak_allocated"] = torch.cuda.max_memory_allocated(device)
        r["peak_reserved"] = torch.cuda.max_memory_reserved(device)
    print(json.dumps(r), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(r, f)


if __name__ == "__main__":
    main(sys.argv[1:])
