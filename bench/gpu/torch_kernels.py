#!/usr/bin/env python3
"""Times a Loom program's compute kernels as eager PyTorch runs the same math on a GPU.

    python3 bench/gpu/torch_kernels.py K.json [K2.json ...] --out TIMED.json [--device cuda]

K.json comes from `loom plan C.toml --kernels K.json` (one entry per distinct op, attributes and
operand types of the predicted program). For each kernel this builds random operands of those
shapes on the device and times what a PyTorch training loop in the style of torchtitan's Llama
runs for that node, eagerly: RMSNorm as `(x.float() * rsqrt(mean(x^2) + eps)).type_as(x) * w`,
RoPE through complex multiplication, attention as repeat_kv + transposes + scaled_dot_product_attention
(causal) + the transpose back, SwiGLU as `silu(g) * u`, cross-entropy as F.cross_entropy forward
and backward, AdamW as the fused kernel after the gradient-clipping multiply, the backward nodes
as autograd's backward of those forwards (retain_graph, so only the backward runs). A node no
mapping covers is timed as a copy of its bytes and marked "how": "copy".

Each kernel: 2 warm-up runs, then repeats until about 50 ms (3 to 25), timed with CUDA events (a
wall clock on the CPU); the median is written as "seconds" beside the input entry. The output is
what `loom calibrate --import TIMED.json --base CLUSTER.toml` turns into a cluster's [profile].

Runs under any PyTorch >= 1.13 (on the CPU too, for a test on small shapes); the GPU timings are
meant for PyTorch 2.x.
"""
import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "i32": torch.int32}


class Timer:
    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def __call__(self, fn):
        if self.cuda:
            a = torch.cuda.Event(enable_timing=True)
            b = torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            return a.elapsed_time(b) / 1e3
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0


def rand(spec, device, scale=1.0):
    dt = DTYPES[spec["dtype"]]
    shape = spec["shape"]
    if dt == torch.int32:
        return torch.zeros(shape, dtype=dt, device=device)
    return (torch.randn(shape, dtype=torch.float32, device=device) * scale).to(dt)


def rms(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).type_as(x) * w


def rope_freqs(T, D, theta, device):
    inv = 1.0 / theta ** (torch.arange(0, D, 2, device=device, dtype=torch.float32) / D)
    ang = torch.outer(torch.arange(T, device=device, dtype=torch.float32), inv)
    return torch.polar(torch.ones_like(ang), ang)


def apply_rope(x, freqs):
    B, T, H, D = x.shape
    xc = torch.view_as_complex(x.float().reshape(B, T, H, D // 2, 2))
    return torch.view_as_real(xc * freqs.view(1, T, 1, D // 2)).flatten(3).type_as(x)


def rope(x, theta):
    freqs = rope_freqs(x.shape[1], x.shape[3], theta, x.device)
    return lambda: apply_rope(x, freqs)


def attention(q, k, v, scale):
    rep = q.shape[2] // k.shape[2]
    if rep > 1:  # torchtitan's repeat_kv: expand, then a copy by reshape
        B, T, H, D = k.shape
        k = k[:, :, :, None, :].expand(B, T, H, rep, D).reshape(B, T, H * rep, D)
        v = v[:, :, :, None, :].expand(B, T, H, rep, D).reshape(B, T, H * rep, D)
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    if hasattr(F, "scaled_dot_product_attention"):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
    else:  # PyTorch 1.13 (a CPU test): the same math, materialised
        s = (q.float() @ k.float().transpose(-1, -2)) * scale
        T = s.shape[-1]
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
        o = (s.softmax(-1) @ v.float()).to(q.dtype)
    return o.transpose(1, 2).contiguous()


def backward_of(forward, primals, grad_out):
    """A closure running only autograd's backward of forward(*primals) against grad_out."""
    leaves = [p.detach().requires_grad_(True) for p in primals]
    out = forward(*leaves)
    return lambda: torch.autograd.grad(out, leaves, grad_out, retain_graph=True)


def matmul_fn(k, ins, device):
    g = k["gemm"]
    dt = DTYPES[k["inputs"][0]["dtype"]]
    M, N, K, batch = g["m"], g["n"], g["k"], g["batch"]
    lead = [batch] if batch > 1 else []
    a = torch.randn(lead + ([K, M] if g["ta"] else [M, K]), device=device).to(dt)
    b = torch.randn(lead + ([N, K] if g["tb"] else [K, N]), device=device).to(dt)
    a = a.transpose(-1, -2) if g["ta"] else a
    b = b.transpose(-1, -2) if g["tb"] else b
    want = DTYPES[k["outputs"][0]["dtype"]]
    if dt == torch.bfloat16 and want == torch.float32 and a.dim() == 2:
        try:  # cuBLAS writing f32 from bf16 operands, as Loom's node does (PyTorch >= 2.8)
            torch.mm(a[:1, :1], b[:1, :1], out_dtype=torch.float32)
            return lambda: torch.mm(a, b, out_dtype=torch.float32), "torch"
        except (TypeError, RuntimeError):
            pass
    return lambda: torch.matmul(a, b), "torch"


def build(k, device):
    """(closure, how) timing kernel k's node."""
    op, at, ins = k["op"], k["attrs"], k["inputs"]
    if op == "matmul" and "gemm" in k:
        return matmul_fn(k, ins, device)
    x = [rand(s, device) for s in ins]
    if op == "add" and len(x) == 2:
        return lambda: x[0] + x[1], "torch"
    if op == "mul_scalar":
        return lambda: x[0] * x[1], "torch"
    if op == "cast":
        to = DTYPES[at["to"]]
        return lambda: x[0].to(to), "torch"
    if op == "rmsnorm":
        eps = at.get("eps", 1e-5)
        return lambda: rms(x[0], x[1], eps), "torch"
    if op == "rmsnorm_bwd":  # (dy, x, w, rstd)
        return backward_of(lambda a, w: rms(a, w, 1e-5), [x[1], x[2]], x[0]), "torch"
    if op == "swiglu":
        return lambda: F.silu(x[0]) * x[1], "torch"
    if op == "swiglu_bwd":  # (dy, gate, up)
        return backward_of(lambda g, u: F.silu(g) * u, [x[1], x[2]], x[0]), "torch"
    if op == "rope":
        return rope(x[0], at.get("theta", 10000.0)), "torch"
    if op == "attention":
        s = at.get("scale")
        return lambda: attention(x[0], x[1], x[2], s), "torch"
    if op == "attention_bwd":  # (dout, q, k, v, out, lse)
        s = at.get("scale")
        return backward_of(lambda q, kk, v: attention(q, kk, v, s), x[1:4], x[0]), "torch"
    if op == "cross_entropy":  # (logits, targets) -> loss, dlogits
        V = x[0].shape[-1]
        t = x[1].long().flatten()

        def ce():
            lg = x[0].detach().requires_grad_(True)
            loss = F.cross_entropy(lg.reshape(-1, V).float(), t)
            return torch.autograd.grad(loss, lg)

        return ce, "torch"
    if op == "embedding":
        t = x[0].long()
        return lambda: F.embedding(t, x[1]), "torch"
    if op == "embedding_bwd":  # (tokens, dy) {V}
        t = x[0].long()
        return lambda: torch.ops.aten.embedding_dense_backward(x[1], t, at["V"], -1, False), "torch"
    if op == "sumsq":  # torchtitan's clip_grad_norm_: a norm per gradient
        return lambda: torch.linalg.vector_norm(x[0], dtype=torch.float32), "torch"
    if op == "adamw":  # (param, grad, m, v, hyper, clip): the clip multiply, then fused AdamW
        p, gr, m, v = x[0], x[1], x[2], x[3].abs()
        clip = torch.tensor(0.5, device=device)
        step = torch.tensor(1.0, device=device)
        kw = dict(lr=3e-4, beta1=at.get("beta1", 0.9), beta2=at.get("beta2", 0.95),
                  weight_decay=at.get("wd", 0.0), eps=at.get("eps", 1e-8), amsgrad=False,
                  maximize=False)
        if device.type == "cuda" and hasattr(torch, "_fused_adamw_"):
            def fused():
                gr.mul_(clip)
                torch._fused_adamw_([p], [gr], [m], [v], [], [step], **kw)

            return fused, "torch"

        def eager():  # the same update, one PyTorch op at a time
            gr.mul_(clip)
            p.mul_(1 - kw["lr"] * kw["weight_decay"])
            m.lerp_(gr, 1 - kw["beta1"])
            v.mul_(kw["beta2"]).addcmul_(gr, gr, value=1 - kw["beta2"])
            p.addcdiv_(m, v.sqrt().add_(kw["eps"]), value=-kw["lr"])

        return eager, "torch"
    if op == "concat":
        return lambda: torch.cat(x, dim=-1), "torch"
    if op == "split":  # Loom's split writes each piece (FSDP2's split_with_sizes_copy does too)
        sizes = at["sizes"]
        return lambda: [t.contiguous() for t in torch.split(x[0], sizes, dim=-1)], "torch"
    if op in ("fill", "clip_coef"):
        return lambda: torch.zeros((), device=device).add_(1.0), "torch"
    # anything else: a copy moving the node's bytes (read + write)
    n = max(1, int(k["bytes"] // 2))
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src), "copy"


def time_kernel(fn, timer, budget_s=0.05):
    for _ in range(2):
        fn()
    first = timer(fn)
    reps = int(min(25, max(3, math.ceil(budget_s / max(first, 1e-6)))))
    return statistics.median([first] + [timer(fn) for _ in range(reps)]), reps + 1


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("kernels", nargs="+", help="JSON files written by loom plan --kernels")
    ap.add_argument("--out", required=True, help="the timed kernels (JSON)")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args(argv)
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("torch_kernels.py: no CUDA device (use --device cpu for a test)")
    seen, kernels = set(), []
    for path in a.kernels:
        try:
            with open(path) as f:
                doc = json.load(f)
            entries = doc["kernels"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            sys.exit(f"torch_kernels.py: {path}: not a `loom plan --kernels` file ({e})")
        for k in entries:
            sig = json.dumps([k["op"], k["attrs"], k["inputs"], k["outputs"]], sort_keys=True)
            if sig not in seen:
                seen.add(sig)
                kernels.append(k)
    timer = Timer(device)
    torch.manual_seed(0)
    out, t0 = [], time.time()
    for i, k in enumerate(kernels):
        try:
            fn, how = build(k, device)
            s, reps = time_kernel(fn, timer)
        except Exception as e:  # noqa: BLE001  (one mapping's failure costs its kernel, not the run)
            print(f"[{i + 1}/{len(kernels)}] {k['op']}: {type(e).__name__}: {e}; timed as a copy",
                  flush=True)
            fn, how = build(dict(k, op="(copy)"), device)
            s, reps = time_kernel(fn, timer)
            how = f"copy ({type(e).__name__})"
        del fn
        if device.type == "cuda":
            torch.cuda.empty_cache()
        row = dict(k, seconds=s, how=how, reps=reps)
        out.append(row)
        print(f"[{i + 1}/{len(kernels)}] {k['op']:<14} {s * 1e3:9.3f} ms  (predicted "
              f"{k.get('predicted_s', 0) * 1e3:.3f}, {how})", flush=True)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    doc = {"device": name, "torch": torch.__version__, "kernels": out,
           "sources": a.kernels, "seconds": time.time() - t0}
    with open(a.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {a.out}: {len(out)} kernels on {name} in {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
