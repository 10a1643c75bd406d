"""Llama and GPT-2 in plain PyTorch eager: Loom's reference models and its benchmark peer.

As a module it is the one model definition that tools/make_golden.py (golden tensors for the C++
tests) and the benchmark CLI below share. Parameters are registered under the Hugging Face names, so
`state_dict()` keys are exactly the names Loom's checkpoints and golden files use.

As a CLI it trains on random tokens and prints one JSON line for `bench/` to set beside Loom's figure:

    /usr/bin/python3 bench/peer/torch_lm.py configs/bench-llama.toml --dtype bf16 --threads 2
    $LOOM_PEER_VENV/bin/python bench/peer/torch_lm.py configs/bench-llama.toml --mode compile

Under Debian's PyTorch 1.13 it is eager with naive attention (1.13 has no fused attention). Under
PyTorch 2.x (bench/peer/setup_venv.sh) it is the strongest idiomatic CPU training step: attention by
`F.scaled_dot_product_attention` (causal, grouped-query heads without copies), AdamW `fused=True`,
and `--mode compile` runs the model under `torch.compile` (inductor), whose compile time is reported
apart from the step time. What it deliberately does not do: no Hugging Face `transformers` modules
(the same math, written here once), no KV cache, no dropout.

Key invariant: with `bf16_casts=True` every rounding to bf16 happens at an explicit `.to(bfloat16)`
in `linear`, `conv1d` or `causal_attention`, the same points as Loom's bf16 recipe; everything else
(embeddings, norms, residual adds, SwiGLU/GELU, biases, the loss, the master weights) stays f32.
The benchmark's bf16 instead runs the f32 code under `torch.autocast` (`bf16_mode: autocast`),
the idiomatic eager path, and is not bit-comparable with Loom.

Dimension letters as in Loom's kernels: B batch, T time, C channels, NH heads, NKV kv heads,
HS head size, F ffn hidden, V vocab, L layers.

Only /usr/bin/python3 imports Debian's PyTorch. Thread counts must be in the environment before
`import torch` (see `set_thread_env`), which is why the CLI parses its arguments first.
"""

import argparse
import json
import math
import os
import resource
import statistics
import sys
import time
import tomllib
from dataclasses import dataclass


def current_rss_bytes():
    """The process's resident memory now (/proc/self/statm), 0 where it cannot be read."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def set_thread_env(threads):
    """Sets the thread count for the BLAS and OpenMP pools; effective only before `import torch`."""
    os.environ["OPENBLAS_NUM_THREADS"] = str(threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)


def parse_cli(argv):
    p = argparse.ArgumentParser(
        description="Train a Loom config's model in PyTorch eager on random tokens; print one JSON line.")
    p.add_argument("config", help="a Loom TOML config, e.g. configs/bench-llama.toml")
    p.add_argument("--dtype", choices=["f32", "bf16"], default=None,
                   help="default: [model] dtype from the config; bf16 runs under torch.autocast")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps before the timed ones")
    p.add_argument("--batch-size", type=int, default=None, help="default: [train] batch_size")
    p.add_argument("--seq-len", type=int, default=None, help="default: [train] seq_len")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mode", choices=["eager", "compile"], default="eager",
                   help="compile: the model under torch.compile (PyTorch 2.x)")
    p.add_argument("--attention", choices=["auto", "naive", "sdpa"], default="auto",
                   help="auto: sdpa where PyTorch has it (2.x), else naive masked softmax")
    return p.parse_args(argv)


if __name__ == "__main__":
    _ARGS = parse_cli(sys.argv[1:])
    set_thread_env(_ARGS.threads)

import torch  # noqa: E402  (after the thread environment is set)
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402


# ----------------------------------------------------------------------------------------------
# Config: the [model], [train] and [optim] tables of a Loom TOML file.


class ConfigError(Exception):
    """Bad user input in a config file or on the command line; the message ends with a hint."""


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_hidden: int
    max_seq_len: int
    norm_eps: float
    rope_theta: float
    dtype: str
    tie_embeddings: bool = False  # Llama: the head is embed_tokens (GPT-2: always)
    moe: "MoeConfig | None" = None  # Mixture-of-Experts MLPs ([model] moe), None: dense
    normformer: bool = False  # NormFormer's extra norms and head scales ([model] normformer)

    def moe_layer(self, layer):
        return self.moe is not None and self.moe.experts > 0 and (layer + 1) % self.moe.every == 0

    @property
    def head_size(self):
        return self.d_model // self.n_heads


@dataclass(frozen=True)
class MoeConfig:
    """[model] moe = { ... }: Loom's keys and defaults (models/model.h MoeConfig)."""
    experts: int = 0
    top_k: int = 2
    every: int = 1
    capacity_factor: float = 1.25
    dropless: bool = False
    aux_loss: float = 0.01
    z_loss: float = 0.001
    balance: str = "model"  # "model": Mixtral's over all layers; "layer": each layer's, averaged

    def capacity(self, T):
        """Slots per expert in each sequence of T tokens."""
        if self.dropless:
            return T
        return min(T, max(1, math.ceil(self.capacity_factor * T * self.top_k / self.experts)))


@dataclass(frozen=True)
class TrainConfig:
    batch_size: int
    seq_len: int


@dataclass(frozen=True)
class OptimConfig:
    lr: float
    beta1: float
    beta2: float
    weight_decay: float
    grad_clip: float


@dataclass(frozen=True)
class Config:
    path: str
    model: ModelConfig
    train: TrainConfig
    optim: OptimConfig


# Keys each table accepts: name -> (type, default; _REQUIRED when required). Only the tables this
# script reads are checked, strictly; other tables ([data], [parallel], ...) belong to Loom and pass.
_REQUIRED = object()
_SAME_AS_N_HEADS = object()
_MODEL_KEYS = {
    "arch": (str, _REQUIRED), "vocab_size": (int, _REQUIRED), "d_model": (int, _REQUIRED),
    "n_layers": (int, _REQUIRED), "n_heads": (int, _REQUIRED), "n_kv_heads": (int, _SAME_AS_N_HEADS),
    "ffn_hidden": (int, _REQUIRED), "max_seq_len": (int, _REQUIRED), "norm_eps": (float, 1e-5),
    "rope_theta": (float, 10000.0), "dtype": (str, "f32"), "tie_embeddings": (bool, False),
    "moe": (dict, None), "normformer": (bool, False),
}
_MOE_KEYS = {"experts": (int, 0), "top_k": (int, 2), "every": (int, 1),
             "capacity_factor": (float, 1.25), "dropless": (bool, False),
             "aux_loss": (float, 0.01), "z_loss": (float, 0.001), "balance": (str, "model")}
_TRAIN_KEYS = {"batch_size": (int, _REQUIRED), "seq_len": (int, _REQUIRED)}
# Loom keys of these tables that describe its training run, not the model or one step: accepted, unused.
_LOOM_ONLY = {
    "model": {"init"},
    "train": {"seed", "steps", "warmup_steps", "min_lr", "eval_every", "eval_batches"},
    "optim": {"eps"},
}
_OPTIM_KEYS = {
    "lr": (float, _REQUIRED), "beta1": (float, 0.9), "beta2": (float, 0.95),
    "weight_decay": (float, 0.0), "grad_clip": (float, 1.0),
}


def _read_table(path, doc, table, keys):
    raw = doc.get(table)
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: missing table [{table}]\nhint: see configs/tiny-llama.toml")
    for k in raw:
        if k not in keys and k not in _LOOM_ONLY.get(table, ()):
            raise ConfigError(f"{path}: [{table}] unknown key '{k}'\n"
                              f"hint: known keys are {', '.join(sorted(keys))}")
    out = {}
    for k, (ty, default) in keys.items():
        if k in raw:
            v = raw[k]
            if ty is float and isinstance(v, int) and not isinstance(v, bool):
                v = float(v)
            if not isinstance(v, ty) or (isinstance(v, bool) and ty is not bool):
                want = {int: "an integer", float: "a number", str: "a quoted string",
                        bool: "true or false"}[ty]
                raise ConfigError(f"{path}: [{table}] {k} = {v!r} is not {want}\n"
                                  f"hint: write {k} as {want}")
            out[k] = v
        elif default is _REQUIRED:
            raise ConfigError(f"{path}: [{table}] missing key '{k}'\nhint: add {k} = ...")
        elif default is _SAME_AS_N_HEADS:
            out[k] = out["n_heads"]
        else:
            out[k] = default
    return out


def load_config(path):
    """Reads and validates a Loom TOML config; raises ConfigError naming the file and key."""
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"{path}: cannot open ({e.strerror})\nhint: pass e.g. configs/tiny-llama.toml")
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML ({e})\nhint: check quoting and table headers")
    fields = _read_table(path, doc, "model", _MODEL_KEYS)
    if fields["moe"] is not None:
        fields["moe"] = MoeConfig(**_read_table(path, doc["model"], "moe", _MOE_KEYS))
    m = ModelConfig(**fields)
    t = TrainConfig(**_read_table(path, doc, "train", _TRAIN_KEYS))
    o = OptimConfig(**_read_table(path, doc, "optim", _OPTIM_KEYS))
    if m.arch not in ("llama", "gpt2"):
        raise ConfigError(f"{path}: [model] arch = {m.arch!r}\nhint: use \"llama\" or \"gpt2\"")
    if m.dtype not in ("f32", "bf16"):
        raise ConfigError(f"{path}: [model] dtype = {m.dtype!r}\nhint: use \"f32\" or \"bf16\"")
    if m.d_model % m.n_heads or m.n_heads % m.n_kv_heads or m.head_size % 2:
        raise ConfigError(f"{path}: [model] d_model={m.d_model}, n_heads={m.n_heads}, "
                          f"n_kv_heads={m.n_kv_heads} do not divide\n"
                          "hint: d_model % n_heads == 0, n_heads % n_kv_heads == 0, head size even")
    if m.arch == "gpt2" and m.n_kv_heads != m.n_heads:
        raise ConfigError(f"{path}: [model] n_kv_heads = {m.n_kv_heads} for gpt2\n"
                          "hint: GPT-2 has no grouped-query attention; drop n_kv_heads")
    check_seq_len(path, m, t.seq_len)
    return Config(path=path, model=m, train=t, optim=o)


def check_seq_len(where, m, seq_len):
    if not 1 <= seq_len <= m.max_seq_len:
        raise ConfigError(f"{where}: seq_len = {seq_len} outside [1, max_seq_len = {m.max_seq_len}]\n"
                          "hint: lower seq_len or raise [model] max_seq_len")


# ----------------------------------------------------------------------------------------------
# The three places a matmul happens. `bf16` selects Loom's explicit-cast recipe; with it off the
# code is plain f32 (and is what runs under torch.autocast in the benchmark).


def linear(x, w, bf16):
    """y = x @ w^T.  x (..., in), w (out, in) -> (..., out) f32; bf16: operands and result rounded."""
    if bf16:
        return (x.to(torch.bfloat16) @ w.to(torch.bfloat16).t()).float()
    return F.linear(x, w)


def conv1d(x, w, b, bf16):
    """GPT-2's Conv1D, y = x @ w + b.  x (..., in), w (in, out), b (out) -> (..., out); bias in f32."""
    if bf16:
        return (x.to(torch.bfloat16) @ w.to(torch.bfloat16)).float() + b
    return torch.addmm(b, x.reshape(-1, x.shape[-1]), w).reshape(*x.shape[:-1], w.shape[1])


def causal_attention(q, k, v, bf16, sdpa=False):
    """Causal attention.  q (B,NH,T,HS), k and v (B,NKV,T,HS) -> (B,T,NH*HS); query head h reads
    kv head h // (NH/NKV).

    Naive (the default): masked softmax over the materialised (T,T) scores. bf16: q, k, v are
    rounded to bf16, scores and softmax computed in f32 on those values, the output rounded to bf16
    (the projection after it then consumes it without another rounding).
    sdpa: PyTorch 2.x's fused `scaled_dot_product_attention` (the benchmark's f32 code; not with bf16).
    """
    B, NH, T, HS = q.shape
    if sdpa:
        assert not bf16, "sdpa runs the f32 code (bf16 comes from autocast)"
        gqa = {"enable_gqa": True} if k.shape[1] != NH else {}
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, **gqa)
        return y.transpose(1, 2).reshape(B, T, NH * HS)
    group = NH // k.shape[1]
    if group > 1:
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
    if bf16:
        q, k, v = (t.to(torch.bfloat16).float() for t in (q, k, v))
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(HS))  # (B,NH,T,T)
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    scores = scores.masked_fill(~causal, float("-inf"))
    y = scores.softmax(dim=-1) @ v  # (B,NH,T,HS)
    y = y.transpose(1, 2).reshape(B, T, NH * HS)
    return y.to(torch.bfloat16) if bf16 else y


# ----------------------------------------------------------------------------------------------
# Leaf modules: each owns its parameters under the Hugging Face leaf names (weight, bias).


class Linear(nn.Module):
    """No bias; weight (out, in) as in nn.Linear."""

    def __init__(self, n_in, n_out, bf16):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_out, n_in))
        self.bf16 = bf16

    def forward(self, x):
        return linear(x, self.weight, self.bf16)


class Conv1D(nn.Module):
    """GPT-2's transposed linear: weight (in, out), bias (out)."""

    def __init__(self, n_in, n_out, bf16):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out))
        self.bias = nn.Parameter(torch.empty(n_out))
        self.bf16 = bf16

    def forward(self, x):
        return conv1d(x, self.weight, self.bias, self.bf16)


class RMSNorm(nn.Module):
    def __init__(self, C, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(C))
        self.eps = eps

    def forward(self, x):  # (..., C) -> (..., C)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class LayerNorm(nn.Module):
    def __init__(self, C, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(C))
        self.bias = nn.Parameter(torch.empty(C))
        self.eps = eps

    def forward(self, x):  # (..., C) -> (..., C)
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)


class Embedding(nn.Module):
    def __init__(self, n, C):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n, C))

    def forward(self, idx):  # int (...) -> (..., C)
        return F.embedding(idx, self.weight)


# ----------------------------------------------------------------------------------------------
# Llama: model.embed_tokens, model.layers.N.{input_layernorm, self_attn.{q,k,v,o}_proj,
# post_attention_layernorm, mlp.{gate,up,down}_proj}, model.norm, lm_head (none when tied: the head
# is then embed_tokens).


def rope_tables(T, HS, theta, dtype, device=None):
    """cos, sin (T, HS) in the Hugging Face layout cat(freqs, freqs).

    inv_freq[i] = theta^(-2i/HS) for i < HS/2, angle[t, i] = t * inv_freq[i]. Computed in float64
    and rounded once to `dtype`, so the table is the correctly rounded value, not f32 pow's.
    """
    inv_freq = theta ** (-torch.arange(0, HS, 2, dtype=torch.float64) / HS)  # (HS/2)
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)  # (T, HS/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (T, HS)
    return emb.cos().to(dtype=dtype, device=device), emb.sin().to(dtype=dtype, device=device)


def rotate_half(x):  # (..., HS): (x1, x2) -> (-x2, x1)
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def apply_rope(x, cos, sin):
    """x (B,T,H,HS), cos/sin (T,HS) -> (B,T,H,HS)."""
    return x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]


class LlamaAttention(nn.Module):
    def __init__(self, m, bf16, sdpa):
        super().__init__()
        C, NH, NKV, HS = m.d_model, m.n_heads, m.n_kv_heads, m.head_size
        self.q_proj = Linear(C, NH * HS, bf16)
        self.k_proj = Linear(C, NKV * HS, bf16)
        self.v_proj = Linear(C, NKV * HS, bf16)
        self.o_proj = Linear(NH * HS, C, bf16)
        if m.normformer:
            self.head_scale = nn.Parameter(torch.empty(NH))
        self.NH, self.NKV, self.HS, self.bf16, self.sdpa = NH, NKV, HS, bf16, sdpa

    def forward(self, x, cos, sin):  # x (B,T,C) -> (B,T,C)
        B, T, _ = x.shape
        q = apply_rope(self.q_proj(x).view(B, T, self.NH, self.HS), cos, sin)
        k = apply_rope(self.k_proj(x).view(B, T, self.NKV, self.HS), cos, sin)
        v = self.v_proj(x).view(B, T, self.NKV, self.HS)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B,H,T,HS)
        return self.o_proj(head_scaled(self, causal_attention(q, k, v, self.bf16, self.sdpa)))


def head_scaled(attn, y):
    """NormFormer: each head's attention output (B,T,NH*HS) times its learned scale (identity
    without one)."""
    if not hasattr(attn, "head_scale"):
        return y
    B, T, _ = y.shape
    return (y.float().view(B, T, attn.NH, attn.HS) * attn.head_scale.view(attn.NH, 1)).view(B, T, -1)


class LlamaMLP(nn.Module):
    def __init__(self, m, bf16):
        super().__init__()
        self.gate_proj = Linear(m.d_model, m.ffn_hidden, bf16)
        self.up_proj = Linear(m.d_model, m.ffn_hidden, bf16)
        self.down_proj = Linear(m.ffn_hidden, m.d_model, bf16)
        if m.normformer:
            self.ffn_layernorm = RMSNorm(m.ffn_hidden, m.norm_eps)

    def forward(self, x):  # (B,T,C) -> (B,T,C); SwiGLU in f32
        h = F.silu(self.gate_proj(x)) * self.up_proj(x)
        if hasattr(self, "ffn_layernorm"):  # NormFormer
            h = self.ffn_layernorm(h)
        return self.down_proj(h)


class Stacked(nn.Module):
    """Every expert's weight of one kind, stacked: (E, ...), under the leaf name `weight`."""

    def __init__(self, *shape):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(*shape))


class MoeRouting:
    """Mixtral's router with capacity, written densely: for logits (B,T,E) the top-k experts,
    their gates (the softmax over the chosen logits, i.e. the chosen probabilities renormalised),
    and which choices fit: each sequence has `capacity` slots per expert, filled choice-major (all
    first choices in token order, then the second choices, ...)."""

    def __init__(self, logits, top_k, capacity):
        B, T, E = logits.shape
        self.logits = logits
        top, self.experts = torch.topk(logits, top_k, dim=-1)  # (B,T,K)
        self.gates = top.softmax(dim=-1)
        onehot = F.one_hot(self.experts, E)  # (B,T,K,E)
        queue = onehot.transpose(1, 2).reshape(B, top_k * T, E)  # choice-major
        position = (queue.cumsum(dim=1) - 1) * queue  # each choice's place in its expert's queue
        position = position.sum(-1).reshape(B, top_k, T).transpose(1, 2)  # (B,T,K)
        self.kept = position < capacity

    def combine(self, expert_outputs):
        """expert_outputs[e]: (B,T,C), expert e applied to every token -> (B,T,C) f32."""
        stacked = torch.stack(expert_outputs, dim=2)  # (B,T,E,C)
        C = stacked.shape[-1]
        picked = stacked.gather(2, self.experts.unsqueeze(-1).expand(*self.experts.shape, C))
        weight = (self.gates * self.kept).unsqueeze(-1)  # dropped choices add nothing
        return (picked * weight).sum(dim=2)


def moe_losses(model, routings):
    """(load-balancing loss, z-loss) over every MoE layer's routing, as transformers' Mixtral
    computes the former (its layers' router logits concatenated) and ST-MoE the latter."""
    E = model.cfg.moe.experts

    def balance_of(group):
        logits = torch.cat([r.logits.reshape(-1, E) for r in group])  # (L*N, E)
        experts = torch.cat([r.experts.reshape(-1, r.experts.shape[-1]) for r in group])
        tokens_per_expert = F.one_hot(experts, E).float().mean(dim=0)  # (K, E)
        router_prob = logits.softmax(dim=-1).mean(dim=0)  # (E)
        return E * (tokens_per_expert * router_prob.unsqueeze(0)).sum()

    if model.cfg.moe.balance == "layer":  # each layer's own, averaged (GShard, Switch)
        balance = torch.stack([balance_of([r]) for r in routings]).mean()
    else:
        balance = balance_of(routings)
    logits = torch.cat([r.logits.reshape(-1, E) for r in routings])
    z = torch.logsumexp(logits, dim=-1).pow(2).mean()
    return balance, z


class LlamaMoe(nn.Module):
    """Mixtral's block_sparse_moe: gate (E,C); experts w1 (gate) and w3 (up) (E,F,C), w2 (E,C,F)."""

    def __init__(self, m, bf16):
        super().__init__()
        E, C, F_ = m.moe.experts, m.d_model, m.ffn_hidden
        self.gate = Linear(C, E, bf16)
        self.experts = nn.Module()
        self.experts.w1, self.experts.w2, self.experts.w3 = Stacked(E, F_, C), Stacked(E, C, F_), \
            Stacked(E, F_, C)
        if m.normformer:  # one norm after SwiGLU, shared by the experts
            self.experts.ffn_layernorm = RMSNorm(F_, m.norm_eps)
        self.m, self.bf16, self.routing = m, bf16, None

    def forward(self, x):  # (B,T,C) -> (B,T,C)
        # the router in f32 whatever the dtype (Switch Transformer's selective precision)
        self.routing = MoeRouting(linear(x, self.gate.weight, False), self.m.moe.top_k,
                                  self.m.moe.capacity(x.shape[1]))
        w1, w2, w3 = (self.experts.w1.weight, self.experts.w2.weight, self.experts.w3.weight)
        norm = getattr(self.experts, "ffn_layernorm", lambda h: h)
        outs = [linear(norm(F.silu(linear(x, w1[e], self.bf16)) * linear(x, w3[e], self.bf16)),
                       w2[e], self.bf16) for e in range(w1.shape[0])]
        return self.routing.combine(outs)


class LlamaLayer(nn.Module):
    def __init__(self, m, bf16, sdpa, moe=False):
        super().__init__()
        self.input_layernorm = RMSNorm(m.d_model, m.norm_eps)
        self.self_attn = LlamaAttention(m, bf16, sdpa)
        self.post_attention_layernorm = RMSNorm(m.d_model, m.norm_eps)
        if m.normformer:
            self.attn_out_layernorm = RMSNorm(m.d_model, m.norm_eps)
        if moe:
            self.block_sparse_moe = LlamaMoe(m, bf16)
        else:
            self.mlp = LlamaMLP(m, bf16)

    def forward(self, x, cos, sin):  # (B,T,C) -> (B,T,C)
        a = self.self_attn(self.input_layernorm(x), cos, sin)
        if hasattr(self, "attn_out_layernorm"):  # NormFormer
            a = self.attn_out_layernorm(a)
        h = x + a
        mlp = self.block_sparse_moe if hasattr(self, "block_sparse_moe") else self.mlp
        return h + mlp(self.post_attention_layernorm(h))


class LlamaBody(nn.Module):
    def __init__(self, m, bf16, sdpa):
        super().__init__()
        self.embed_tokens = Embedding(m.vocab_size, m.d_model)
        self.layers = nn.ModuleList(LlamaLayer(m, bf16, sdpa, m.moe_layer(l))
                                    for l in range(m.n_layers))
        self.norm = RMSNorm(m.d_model, m.norm_eps)


class Llama(nn.Module):
    def __init__(self, m, bf16=False, sdpa=False):
        super().__init__()
        self.cfg = m
        self.model = LlamaBody(m, bf16, sdpa)
        self.bf16 = bf16
        if not m.tie_embeddings:
            self.lm_head = Linear(m.d_model, m.vocab_size, bf16)

    def forward(self, tokens):  # int (B,T) -> logits (B,T,V) f32
        x = self.model.embed_tokens(tokens)
        T = tokens.shape[1]
        cos, sin = rope_tables(T, self.cfg.head_size, self.cfg.rope_theta, x.dtype, x.device)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        x = self.model.norm(x)
        if self.cfg.tie_embeddings:
            return linear(x, self.model.embed_tokens.weight, self.bf16)
        return self.lm_head(x)


# ----------------------------------------------------------------------------------------------
# GPT-2: wte, wpe, h.N.{ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj}, ln_f;
# lm_head tied to wte.


class GPT2Attention(nn.Module):
    def __init__(self, m, bf16, sdpa):
        super().__init__()
        self.c_attn = Conv1D(m.d_model, 3 * m.d_model, bf16)
        self.c_proj = Conv1D(m.d_model, m.d_model, bf16)
        if m.normformer:
            self.head_scale = nn.Parameter(torch.empty(m.n_heads))
        self.NH, self.HS, self.bf16, self.sdpa = m.n_heads, m.head_size, bf16, sdpa

    def forward(self, x):  # (B,T,C) -> (B,T,C)
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=-1)  # each (B,T,C)
        q, k, v = (t.view(B, T, self.NH, self.HS).transpose(1, 2) for t in (q, k, v))
        return self.c_proj(head_scaled(self, causal_attention(q, k, v, self.bf16, self.sdpa)))


class GPT2MLP(nn.Module):
    def __init__(self, m, bf16):
        super().__init__()
        self.c_fc = Conv1D(m.d_model, m.ffn_hidden, bf16)
        self.c_proj = Conv1D(m.ffn_hidden, m.d_model, bf16)
        if m.normformer:
            self.ln_fc = LayerNorm(m.ffn_hidden, m.norm_eps)

    def forward(self, x):  # (B,T,C) -> (B,T,C); GELU (tanh) in f32
        h = F.gelu(self.c_fc(x), approximate="tanh")
        if hasattr(self, "ln_fc"):  # NormFormer
            h = self.ln_fc(h)
        return self.c_proj(h)


class GPT2Moe(nn.Module):
    """Loom's GPT-2 MoE MLP, Conv1D layout: gate (C,E); experts c_fc (E,C,F), c_proj (E,F,C), GELU
    (tanh), no biases."""

    def __init__(self, m, bf16):
        super().__init__()
        E, C, F_ = m.moe.experts, m.d_model, m.ffn_hidden
        self.gate = Stacked(C, E)
        self.experts = nn.Module()
        self.experts.c_fc, self.experts.c_proj = Stacked(E, C, F_), Stacked(E, F_, C)
        if m.normformer:  # one LayerNorm after GELU, shared by the experts
            self.experts.ln_fc = LayerNorm(F_, m.norm_eps)
        self.m, self.bf16, self.routing = m, bf16, None

    def forward(self, x):  # (B,T,C) -> (B,T,C)
        mm = (lambda a, w: (a.to(torch.bfloat16) @ w.to(torch.bfloat16)).float()) if self.bf16 \
            else (lambda a, w: a @ w)
        self.routing = MoeRouting(x @ self.gate.weight, self.m.moe.top_k,  # f32 router
                                  self.m.moe.capacity(x.shape[1]))
        fc, proj = self.experts.c_fc.weight, self.experts.c_proj.weight
        norm = getattr(self.experts, "ln_fc", lambda h: h)
        outs = [mm(norm(F.gelu(mm(x, fc[e]), approximate="tanh")), proj[e])
                for e in range(fc.shape[0])]
        return self.routing.combine(outs)


class GPT2Block(nn.Module):
    def __init__(self, m, bf16, sdpa, moe=False):
        super().__init__()
        self.ln_1 = LayerNorm(m.d_model, m.norm_eps)
        self.attn = GPT2Attention(m, bf16, sdpa)
        if m.normformer:
            self.ln_attn = LayerNorm(m.d_model, m.norm_eps)
        self.ln_2 = LayerNorm(m.d_model, m.norm_eps)
        self.mlp = GPT2Moe(m, bf16) if moe else GPT2MLP(m, bf16)

    def forward(self, x):
        a = self.attn(self.ln_1(x))
        if hasattr(self, "ln_attn"):  # NormFormer
            a = self.ln_attn(a)
        x = x + a
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    def __init__(self, m, bf16=False, sdpa=False):
        super().__init__()
        self.cfg, self.bf16 = m, bf16
        self.wte = Embedding(m.vocab_size, m.d_model)
        self.wpe = Embedding(m.max_seq_len, m.d_model)
        self.h = nn.ModuleList(GPT2Block(m, bf16, sdpa, m.moe_layer(l)) for l in range(m.n_layers))
        self.ln_f = LayerNorm(m.d_model, m.norm_eps)

    def forward(self, tokens):  # int (B,T) -> logits (B,T,V) f32
        T = tokens.shape[1]
        x = self.wte(tokens) + self.wpe.weight[:T]
        for block in self.h:
            x = block(x)
        return linear(self.ln_f(x), self.wte.weight, self.bf16)  # tied lm_head


# ----------------------------------------------------------------------------------------------
# Shared by the benchmark and the golden script.


def build_model(m, bf16_casts=False, sdpa=False):
    """The model for `m`, parameters uninitialized (torch.empty). bf16_casts: Loom's bf16 recipe;
    sdpa: attention by PyTorch 2.x's fused kernel (the benchmark's f32 code only)."""
    return (Llama if m.arch == "llama" else GPT2)(m, bf16_casts, sdpa)


def has_sdpa():
    return hasattr(F, "scaled_dot_product_attention")


def torch_major():
    return int(torch.__version__.split(".")[0])


def param_kind(name, p):
    """'matrix' (ndim >= 2: linears and embeddings), 'norm' (1-D weight) or 'bias'."""
    if p.ndim >= 2:
        return "matrix"
    return "bias" if name.endswith(".bias") else "norm"


@torch.no_grad()
def init_for_bench(model, generator=None):
    """normal(0, 0.02) for matrices and embeddings, ones for norm weights, zeros for biases."""
    for name, p in model.named_parameters():
        kind = param_kind(name, p)
        if kind == "matrix":
            p.normal_(0.0, 0.02, generator=generator)
        elif kind == "norm":
            p.fill_(1.0)
        else:
            p.zero_()


def lm_loss(logits, targets):
    """Mean cross-entropy over all B*T targets.  logits (B,T,V), targets int (B,T) -> scalar."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def train_loss(model, logits, targets):
    """The training objective of the forward that made `logits`: the cross-entropy, plus for an
    MoE model aux_loss x the load-balancing loss and z_loss x the router z-loss (Loom's `loss`)."""
    loss = lm_loss(logits, targets)
    routings = [mod.routing for mod in model.modules() if isinstance(mod, (LlamaMoe, GPT2Moe))]
    if routings:
        balance, z = moe_losses(model, routings)
        loss = loss + model.cfg.moe.aux_loss * balance + model.cfg.moe.z_loss * z
    return loss


def make_adamw(model, o, foreach=None, fused=None):
    """AdamW with nanoGPT's decay rule: weight decay on ndim >= 2 parameters only, eps 1e-8.
    fused: PyTorch 2.x's one-kernel CPU AdamW (same math); None leaves PyTorch's default."""
    params = list(model.parameters())
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": o.weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    extra = {} if fused is None else {"fused": fused}
    return torch.optim.AdamW(groups, lr=o.lr, betas=(o.beta1, o.beta2), eps=1e-8, foreach=foreach,
                             **extra)


# ----------------------------------------------------------------------------------------------
# The benchmark CLI.


def blas_library():
    """Which BLAS runs PyTorch's f32 GEMM.

    PyTorch 2.x wheels link it in (BLAS_INFO in `torch.__config__.show()`, MKL on x86), with the CPU
    capability its kernels dispatch to. Debian's 1.13 takes it from the system: the real path of each
    BLAS shared library this process loaded, or "unknown" (see `system_blas`).
    """
    config = torch.__config__.show()
    info = [w.split("=", 1)[1].rstrip(",") for w in config.split() if w.startswith("BLAS_INFO=")]
    if info and info[0] not in ("open", "generic"):  # "generic": the system's libblas
        capability = [line.split(":", 1)[1].strip() for line in config.splitlines()
                      if "CPU capability usage" in line]
        return f"{info[0]} (linked into torch; CPU capability {capability[0] if capability else '?'})"
    return system_blas()


def system_blas():
    """The real path of each BLAS shared library this process loaded, or "unknown".

    PyTorch's f32 GEMM goes to whatever libblas.so.3 resolves to; on Debian that may be the netlib
    reference BLAS (single-threaded, a few GFLOP/s), which decides the f32 figure. The directory
    tells them apart: .../blas/ is netlib, .../openblas-pthread/ is OpenBLAS.
    """
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "blas" in line.lower() and "/" in line}
    except OSError:
        return "unknown"
    names = sorted({os.path.realpath(p) for p in paths})
    # OpenBLAS says which kernel set it chose (OPENBLAS_CORETYPE overrides its own detection)
    for n in names:
        if "libopenblas" in os.path.basename(n):
            try:
                import ctypes
                get = ctypes.CDLL(n).openblas_get_corename
                get.restype = ctypes.c_char_p
                return ",".join(names) + " (OpenBLAS core: %s)" % get().decode()
            except (OSError, AttributeError):
                pass
    return ",".join(names) or "unknown"


def make_step(forward, model, opt, inputs, targets, grad_clip, bf16=False, after_backward=None):
    """The benchmarks' training step: zero_grad, forward (`forward`: the model, or its DDP wrapper;
    under autocast for bf16), loss, backward, `after_backward()` if given, clip_grad_norm_, AdamW;
    returns the loss."""
    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = forward(inputs)
        loss = lm_loss(logits.float(), targets)
        loss.backward()
        if after_backward:
            after_backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        opt.step()
        return loss.item()
    return step


def time_steps(step, warmup, steps, before=lambda: None):
    """Runs `warmup` untimed steps, then `steps` timed ones (each after `before()`); returns the
    seconds of each timed step and the last loss."""
    for _ in range(warmup):
        step()
    times, loss = [], None
    for _ in range(steps):
        before()
        t0 = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t0)
    return times, loss


def result_fields(m, B, T, model, times, loss, args):
    """What every peer's JSON line says of its run (torch_lm.py and torch_dist.py): the model and
    batch, the step times (seconds) as tokens/s and ms, the BLAS it ran, the last loss."""
    median = statistics.median(times)
    return {
        "torch_version": torch.__version__,
        "arch": m.arch,
        "batch_size": B,
        "seq_len": T,
        "params": sum(p.numel() for p in model.parameters()),
        "tokens_per_s": B * T / median,
        "step_ms": {"median": median * 1e3, "min": min(times) * 1e3, "max": max(times) * 1e3},
        "steps": args.steps,
        "warmup": args.warmup,
        "blas": blas_library(),
        "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE", "(unset)"),
        "final_loss": loss,
    }


def bench(args):
    cfg = load_config(args.config)
    m = cfg.model
    dtype = args.dtype or m.dtype
    B = args.batch_size or cfg.train.batch_size
    T = args.seq_len or cfg.train.seq_len
    check_seq_len("--seq-len", m, T)
    if args.threads < 1 or args.steps < 1 or args.warmup < 0 or B < 1:
        raise ConfigError("--threads, --steps, --batch-size must be >= 1 and --warmup >= 0\n"
                          "hint: e.g. --threads 2 --steps 10 --warmup 3")
    modern = torch_major() >= 2
    if args.mode == "compile" and not modern:
        raise ConfigError(f"--mode compile needs PyTorch 2.x; this is {torch.__version__}\n"
                          "hint: run it with the peer venv's python (bench/peer/setup_venv.sh)")
    if args.attention == "sdpa" and not has_sdpa():
        raise ConfigError(f"--attention sdpa: PyTorch {torch.__version__} has no "
                          "scaled_dot_product_attention\nhint: --attention naive, or PyTorch 2.x")
    sdpa = args.attention == "sdpa" or (args.attention == "auto" and has_sdpa())
    torch.set_num_threads(args.threads)
    g = torch.Generator().manual_seed(args.seed)
    baseline_rss = current_rss_bytes()  # the framework loaded, no model yet

    model = build_model(m, sdpa=sdpa)  # f32 code; bf16 comes from autocast below
    init_for_bench(model, g)
    opt = make_adamw(model, cfg.optim, fused=True if modern else None)
    batch = torch.randint(0, m.vocab_size, (B, T + 1), generator=g)
    inputs, targets = batch[:, :-1], batch[:, 1:]

    forward = torch.compile(model) if args.mode == "compile" else model
    step = make_step(forward, model, opt, inputs, targets, cfg.optim.grad_clip,
                     bf16=(dtype == "bf16"))
    compile_s = None
    if args.mode == "compile":  # the first step compiles forward and backward: timed apart
        t0 = time.perf_counter()
        step()
        compile_s = time.perf_counter() - t0
    times, loss = time_steps(step, args.warmup, args.steps)

    out = {
        "peer": f"pytorch-{args.mode}",
        **result_fields(m, B, T, model, times, loss, args),
        "dtype": dtype,
        "threads": torch.get_num_threads(),
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        # what the process held resident with the framework loaded and no model yet, and its peak
        # above that: the model, optimizer state and steps (compilation too under --mode compile)
        "baseline_rss_bytes": baseline_rss,
        "peak_above_baseline_bytes":
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - baseline_rss,
        "attention": "sdpa" if sdpa else "naive_masked_softmax",
        "optimizer": "adamw-fused" if modern else "adamw",
    }
    if compile_s is not None:
        out["compile_s"] = compile_s
    if dtype == "bf16":
        out["bf16_mode"] = "autocast"
    print(json.dumps(out))


if __name__ == "__main__":
    try:
        bench(_ARGS)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
