"""Writes golden tensors for Loom's C++ golden tests: weights, a token batch, and PyTorch's loss,
logits, every gradient and ten AdamW steps of losses for one config.

    /usr/bin/python3 tools/make_golden.py --config configs/tiny-llama.toml --out DIR [--dtype bf16]

DIR receives
    weights.safetensors   every parameter under its Hugging Face name, f32
    tokens.safetensors    "tokens" i32 (B, T+1); inputs are tokens[:, :-1], targets tokens[:, 1:]
    expected.safetensors  "loss" f32 [], "logits" f32 (B,T,V), "grad.<name>" f32 per parameter
                          (the raw gradient of the initial loss, before clipping), "losses" f32 (10)
                          and "grad_norms" f32 (10): loss and pre-clip global gradient norm at each
                          of 10 AdamW steps on the same batch (losses[i] is computed before update i);
                          for a Mixture-of-Experts model also "router_logits.<module>" f32 (B,T,E),
                          each MoE layer's router logits of the first forward (golden_test judges
                          from them which layers have tokens whose experts nearly tie)
    meta.json             config, dtype, seed, torch version and the exact optimizer recipe

The model is bench/peer/torch_lm.py's, so the benchmark peer and the goldens cannot drift apart.
dtype f32 runs in f32 (or, with --f64, in float64 from the same f32 weights, stored back as f32: the
"truth" to judge whether Loom's f32 is closer to it than PyTorch's f32 is); dtype bf16 runs Loom's
explicit-cast bf16 recipe (see torch_lm.linear / conv1d / causal_attention) with f32 master weights.

What it deliberately does not do: no autocast, no learning-rate schedule, no data loader. It runs
single-threaded so that the same command writes the same bytes.

Key invariant: a file is either absent or complete and re-read: each is written to a temporary
name, read back with the reader below and checked against what was meant to be written, then
renamed into place.
"""

import os

os.environ["OPENBLAS_NUM_THREADS"] = "1"  # before `import torch`: see torch_lm.set_thread_env
os.environ["OMP_NUM_THREADS"] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import struct  # noqa: E402
import sys  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "bench", "peer"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import torch_lm  # noqa: E402

kSteps = 10

# ----------------------------------------------------------------------------------------------
# safetensors, the subset Loom reads: an 8-byte little-endian header length N, N bytes of JSON
# (padded with spaces to a multiple of 8 so the data starts aligned), then the tensors back to back
# in header order. Each header entry is {"dtype", "shape", "data_offsets": [begin, end)} with
# offsets relative to the start of the data. Example: a scalar f32 "loss" and an i32 (2,3) "tokens":
#   {"loss":{"dtype":"F32","shape":[],"data_offsets":[0,4]},
#    "tokens":{"dtype":"I32","shape":[2,3],"data_offsets":[4,28]}}
# Written by hand because Debian's python3 has no `safetensors` package.

_ST_DTYPES = {torch.float32: ("F32", "<f4"), torch.int32: ("I32", "<i4")}
_ST_NUMPY = {name: np.dtype(np_dtype) for name, np_dtype in _ST_DTYPES.values()}


def safetensors_bytes(tensors):
    """tensors: dict name -> f32 or i32 torch tensor (insertion order kept) -> the file's bytes."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        if t.dtype not in _ST_DTYPES:
            raise ValueError(f"safetensors: {name} has dtype {t.dtype}; only f32 and i32 are written")
        st_dtype, np_dtype = _ST_DTYPES[t.dtype]
        blob = t.detach().contiguous().numpy().astype(np_dtype, copy=False).tobytes()
        header[name] = {"dtype": st_dtype, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def read_safetensors(path):
    """The matching reader: path -> dict name -> torch tensor. Rejects anything malformed."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise ValueError(f"{path}: header length {n} runs past the end of the file")
    header = json.loads(data[8:8 + n].decode("utf-8"))
    body = data[8 + n:]
    out, expect_begin = {}, 0
    for name, e in header.items():
        if name == "__metadata__":
            continue
        dtype = _ST_NUMPY[e["dtype"]]
        begin, end = e["data_offsets"]
        count = int(np.prod(e["shape"], dtype=np.int64))
        if begin != expect_begin or end - begin != count * dtype.itemsize or end > len(body):
            raise ValueError(f"{path}: {name} has bad data_offsets {e['data_offsets']}")
        arr = np.frombuffer(body, dtype=dtype, count=count, offset=begin).reshape(e["shape"])
        out[name] = torch.from_numpy(arr.copy())
        expect_begin = end
    if expect_begin != len(body):
        raise ValueError(f"{path}: {len(body) - expect_begin} trailing bytes after the last tensor")
    return out


def write_safetensors(path, tensors):
    """Writes, re-reads and compares (names, dtypes, shapes, exact values), then renames into place."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(safetensors_bytes(tensors))
    back = read_safetensors(tmp)
    assert list(back) == list(tensors), f"{path}: names differ on re-read"
    for name, t in tensors.items():
        b = back[name]
        assert b.dtype == t.dtype and b.shape == t.shape, \
            f"{path}: {name} re-read as {b.dtype}{list(b.shape)}, wrote {t.dtype}{list(t.shape)}"
        assert torch.equal(b, t), f"{path}: {name} values differ on re-read"
    os.replace(tmp, path)


# ----------------------------------------------------------------------------------------------
# The reference run.


@torch.no_grad()
def init_for_golden(model, g):
    """normal(0, 0.02) for matrices and embeddings; 1 + 0.1*randn for norm weights and 0.02*randn
    for biases, so that their gradients are not the special case of ones and zeros. Parameters are
    drawn in state_dict order from one generator."""
    for name, p in model.named_parameters():
        kind = torch_lm.param_kind(name, p)
        if kind == "matrix":
            p.normal_(0.0, 0.02, generator=g)
        elif kind == "norm":
            p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
        else:
            p.copy_(0.02 * torch.randn(p.shape, generator=g))


def reference_run(cfg, dtype, seed, f64):
    """-> (weights, tokens, expected): dicts of f32/i32 tensors as written to the three files."""
    m, B, T = cfg.model, cfg.train.batch_size, cfg.train.seq_len
    g = torch.Generator().manual_seed(seed)
    model = torch_lm.build_model(m, bf16_casts=(dtype == "bf16"))
    init_for_golden(model, g)
    weights = {name: p.detach().clone() for name, p in model.named_parameters()}
    tokens = torch.randint(0, m.vocab_size, (B, T + 1), generator=g, dtype=torch.int64)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    if f64:
        model.double()  # from the same f32 values; only the arithmetic changes

    params = dict(model.named_parameters())
    opt = torch_lm.make_adamw(model, cfg.optim, foreach=False)
    expected, losses, grad_norms = {}, [], []
    for i in range(kSteps):
        opt.zero_grad(set_to_none=True)
        logits = model(inputs)  # (B,T,V)
        loss = torch_lm.train_loss(model, logits, targets)
        loss.backward()
        if i == 0:
            expected["loss"] = loss.detach().float().reshape(())
            expected["logits"] = logits.detach().float().contiguous()
            for name, p in params.items():
                expected["grad." + name] = p.grad.detach().float().clone()
            for name, mod in model.named_modules():
                routing = getattr(mod, "routing", None)
                if isinstance(routing, torch_lm.MoeRouting):
                    expected["router_logits." + name] = routing.logits.detach().float().contiguous()
        losses.append(loss.item())
        # Returns the pre-clip norm; grads are scaled by min(1, clip / (norm + 1e-6)).
        grad_norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip).item())
        opt.step()
    expected["losses"] = torch.tensor(losses, dtype=torch.float64).float()
    expected["grad_norms"] = torch.tensor(grad_norms, dtype=torch.float64).float()
    return weights, {"tokens": tokens.to(torch.int32)}, expected


def meta(args, cfg, expected):
    o = cfg.optim
    return {
        "config": args.config,
        "arch": cfg.model.arch,
        "dtype": args.dtype,
        "f64": args.f64,
        "seed": args.seed,
        "torch_version": torch.__version__,
        "batch_size": cfg.train.batch_size,
        "seq_len": cfg.train.seq_len,
        "steps": kSteps,
        "optimizer": {
            "name": "torch.optim.AdamW (foreach=False)",
            "lr": o.lr, "beta1": o.beta1, "beta2": o.beta2, "eps": 1e-8,
            "weight_decay": o.weight_decay, "weight_decay_applies_to": "ndim >= 2 only",
            "update": "p *= 1 - lr*wd; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2; "
                      "p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)",
            "grad_clip": o.grad_clip,
            "clip": "clip_grad_norm_: g *= min(1, grad_clip / (global_l2_norm + 1e-6))",
            "schedule": "constant lr",
        },
        "grads": "grad.<name> is the raw gradient of the initial loss, before clipping",
        "loss": float(expected["loss"]),
    }


def main(argv):
    p = argparse.ArgumentParser(description="Write PyTorch golden tensors for a Loom config.")
    p.add_argument("--config", required=True, help="e.g. configs/tiny-llama.toml")
    p.add_argument("--out", required=True, help="output directory (created if missing)")
    p.add_argument("--dtype", choices=["f32", "bf16"], default=None,
                   help="default: [model] dtype from the config")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--f64", action="store_true",
                   help="compute the f32 golden in float64 (results stored as f32)")
    args = p.parse_args(argv)

    try:
        cfg = torch_lm.load_config(args.config)
        args.dtype = args.dtype or cfg.model.dtype
        if args.f64 and args.dtype != "f32":
            raise torch_lm.ConfigError("--f64 with --dtype bf16\n"
                                       "hint: --f64 is the float64 truth for the f32 golden only")
        os.makedirs(args.out, exist_ok=True)
    except torch_lm.ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"error: {args.out}: cannot create ({e.strerror})\nhint: pick a writable --out",
              file=sys.stderr)
        return 2

    torch.set_num_threads(1)
    weights, tokens, expected = reference_run(cfg, args.dtype, args.seed, args.f64)

    write_safetensors(os.path.join(args.out, "weights.safetensors"), weights)
    write_safetensors(os.path.join(args.out, "tokens.safetensors"), tokens)
    write_safetensors(os.path.join(args.out, "expected.safetensors"), expected)
    meta_path = os.path.join(args.out, "meta.json")
    with open(meta_path + ".tmp", "w") as f:
        json.dump(meta(args, cfg, expected), f, indent=2)
        f.write("\n")
    os.replace(meta_path + ".tmp", meta_path)

    # Shapes as the C++ test will expect them.
    m, B, T = cfg.model, cfg.train.batch_size, cfg.train.seq_len
    back_w = read_safetensors(os.path.join(args.out, "weights.safetensors"))
    back_e = read_safetensors(os.path.join(args.out, "expected.safetensors"))
    back_t = read_safetensors(os.path.join(args.out, "tokens.safetensors"))
    assert back_t["tokens"].shape == (B, T + 1) and back_t["tokens"].dtype == torch.int32
    assert int(back_t["tokens"].min()) >= 0 and int(back_t["tokens"].max()) < m.vocab_size
    assert back_e["loss"].shape == () and back_e["logits"].shape == (B, T, m.vocab_size)
    assert back_e["losses"].shape == (kSteps,) and back_e["grad_norms"].shape == (kSteps,)
    for name, w in back_w.items():
        assert w.dtype == torch.float32 and back_e["grad." + name].shape == w.shape, name
    routers = [k for k in back_e if k.startswith("router_logits.")]
    assert bool(routers) == (m.moe is not None and m.moe.experts > 0), routers
    for k in routers:
        assert back_e[k].shape[:2] == (B, T) and back_e[k].shape[2] == m.moe.experts, k
    assert len(back_e) == len(back_w) + 4 + len(routers)

    print(f"wrote {args.out}: {cfg.model.arch} dtype={args.dtype}{' (f64)' if args.f64 else ''} "
          f"seed={args.seed} params={sum(w.numel() for w in back_w.values())} "
          f"loss={float(back_e['loss']):.6f}")
    print("losses " + " ".join(f"{x:.6f}" for x in back_e["losses"].tolist()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
