#!/usr/bin/env python3
"""torchft's DiLoCo beside loom islands on the same settings (issue 16's peer).

    $LOOM_PEER_VENV/bin/python bench/islands/torchft_peer.py [--steps 3000] [--h 30]
        [--islands 4] [--outer-lr 1.0] [--outer-momentum 0.5] [--out runs/torchft_peer]
        [--layers 4 --fragments 4 [--overlap 2 --mix 0.5]]

Needs PyTorch 2.x and torchft (`bench/peer/setup_venv.sh` installs both, pinned); Debian's
PyTorch 1.13 has neither. Both sides train configs/tiny-llama.toml, byte-level, on the default
Gutenberg text, from the same initial weights (written here, normal(0, 0.02), and given to Loom as
`[model] init`), with the same inner AdamW (lr, betas, weight decay on matrices, grad clip 1.0),
warmup-and-cosine schedule, batch 4 x 64 per island, H, and outer Nesterov SGD; and on the same
batches: this file draws them exactly as Loom's TextCorpus::sample does (the same files, split and
splitmix64 offsets; island i of torchft reads the stream of Loom's island id i + 1).

- Loom: `loom islands` (the outer server and N `loom train` processes).
- torchft: a Lighthouse bound to 127.0.0.1 and N replica groups of one process each, every one a
  torchft Manager over Gloo with `torchft.local_sgd.DiLoCo` wrapping the model (its all-reduce of the
  pseudo-gradients replaces Loom's server). With --fragments F (streaming DiLoCo), the model's
  fragments are Loom's (src/loom/outer/fragments.h: layers strided, then the embedding, head and
  norm each to the lightest fragment), each with its own outer SGD; --overlap and --mix are
  torchft's fragment_sync_delay and fragment_update_alpha. torchft's quantised all-reduce needs a
  GPU, so the peer's pushes are f32.
Each side's final global parameters are evaluated here, by the same PyTorch model on the same 16
validation batches Loom uses (Loom's own figure, from its evaluator, is printed beside it). Wall time
is each side's whole run, N processes sharing this machine's cores with one thread each. Bytes: the
loopback interface's counters across each run (everything either side sent, control traffic
included), and Loom's own payload count.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bench", "peer"))
import torch_lm  # noqa: E402
from runs import LOOM, island_env  # noqa: E402

CONFIG = os.path.join(ROOT, "configs", "tiny-llama.toml")
DATA = os.path.join(ROOT, "data", "gutenberg")
MASK = (1 << 64) - 1


# ---- Loom's batches (src/loom/data/text_corpus.cc) ----

def splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def split_text(path, val_every=10):
    files = sorted(os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs if f.endswith(".txt"))
    train, val, val_files = bytearray(), bytearray(), 0
    for i, f in enumerate(files):
        data = open(f, "rb").read()
        is_val = len(files) >= 2 and (i % val_every == val_every - 1 or
                                      (i + 1 == len(files) and val_files == 0))
        (val if is_val else train).extend(data)
        val_files += is_val
    return bytes(train), bytes(val)


def sample(src, seed, step, rank, B, T):
    """TextCorpus::sample: B rows of T + 1 tokens (bytes)."""
    span = len(src) - T - 1
    rows = []
    for r in range(B):
        h = splitmix64((seed ^ splitmix64((step & MASK) ^ splitmix64(
            (rank * 1315423911 + r) & MASK))) & MASK)
        off = h % (span + 1)
        rows.append(list(src[off:off + T + 1]))
    return rows


# ---- the shared pieces ----

def schedule(step, lr, warm, steps, min_lr=0.0):
    """Loom's Schedule::at: linear warmup, then cosine to min_lr ([train] min_lr's default, 0)."""
    import math
    if warm > 0 and step < warm:
        return lr * step / warm
    if steps <= warm:
        return lr
    p = min(max((step - 1 - warm) / (steps - warm), 0.0), 1.0)
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * p))


def load_cfg(args):
    import dataclasses
    c = torch_lm.load_config(CONFIG)
    m = c.model if not args or not args.layers else dataclasses.replace(c.model, n_layers=args.layers)
    return m, c.train, c.optim


def fragments(model, f):
    """Loom's split (fragments.h) as torchft wants it: a list of modules per fragment."""
    import torch.nn as nn
    if f == 1:
        return [model]
    parts = [[] for _ in range(f)]
    size = [0] * f
    for i, layer in enumerate(model.model.layers):
        parts[i % f].append(layer)
        size[i % f] += sum(p.numel() for p in layer.parameters())
    rest = [model.model.embed_tokens, model.model.norm] + (
        [model.lm_head] if hasattr(model, "lm_head") else [])
    for mod in sorted(rest, key=lambda x: -sum(p.numel() for p in x.parameters())):
        k = size.index(min(size))
        parts[k].append(mod)
        size[k] += sum(p.numel() for p in mod.parameters())
    return [nn.ModuleList(p) for p in parts]


def evaluate(state, args):
    import torch
    m, t, _ = load_cfg(args)
    model = torch_lm.Llama(m)
    model.load_state_dict(state)
    _, val = split_text(DATA)
    total = 0.0
    with torch.no_grad():
        for i in range(args.eval_batches):
            rows = torch.tensor(sample(val, args.seed + 7777, i, 0, t.batch_size, t.seq_len))
            total += torch_lm.lm_loss(model(rows[:, :-1]), rows[:, 1:]).item()
    return total / args.eval_batches


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lo_bytes():
    """Bytes the loopback interface has carried (received = sent on lo)."""
    with open("/proc/net/dev") as f:
        for line in f:
            if line.strip().startswith("lo:"):
                return int(line.split(":")[1].split()[0])
    return 0


# ---- a torchft replica (one process) ----

def replica(args):
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    import torch.distributed as dist
    from safetensors.torch import load_file, save_file
    from torchft import Manager, ProcessGroupGloo
    from torchft.local_sgd import DiLoCo
    from datetime import timedelta
    torch.set_num_threads(1)
    m, t, o = load_cfg(args)
    model = torch_lm.Llama(m)
    model.load_state_dict(load_file(args.init))
    inner = torch_lm.make_adamw(model, o)
    frags = fragments(model, args.fragments)
    outer = [torch.optim.SGD(fr.parameters(), lr=args.outer_lr, momentum=args.outer_momentum,
                             nesterov=True) for fr in frags]
    store = dist.TCPStore(host_name="127.0.0.1", port=0, is_master=True, wait_for_workers=False)
    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=60)), min_replica_size=args.islands,
        use_async_quorum=False, load_state_dict=lambda s: model.load_state_dict(s["model"]),
        state_dict=lambda: {"model": model.state_dict()}, replica_id="island_%d" % args.replica,
        store_addr="127.0.0.1", store_port=store.port, rank=0, world_size=1,
        lighthouse_addr=args.lighthouse, port=0, hostname="127.0.0.1",
        connect_timeout=timedelta(seconds=60), quorum_timeout=timedelta(seconds=120),
        timeout=timedelta(seconds=120))
    train, _ = split_text(DATA)
    with DiLoCo(manager, frags, inner, outer, sync_every=args.h, backup_device=torch.device("cpu"),
                fragment_sync_delay=args.overlap, fragment_update_alpha=args.mix):
        for step in range(1, args.steps + 1):
            rows = torch.tensor(sample(train, args.seed, step, args.replica, t.batch_size, t.seq_len))
            for g in inner.param_groups:
                g["lr"] = schedule(step, o.lr, args.warmup, args.steps)
            inner.zero_grad()
            loss = torch_lm.lm_loss(model(rows[:, :-1]), rows[:, 1:])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), o.grad_clip)
            inner.step()  # DiLoCo syncs every H of these
    if args.replica == 0:
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, args.final)
    manager.shutdown()


# ---- the driver ----

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--loom", default=LOOM)
    ap.add_argument("--out", default=os.path.join(ROOT, "runs/torchft_peer"))
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--h", type=int, default=30)
    ap.add_argument("--islands", type=int, default=4)
    ap.add_argument("--outer-lr", type=float, default=1.0)
    ap.add_argument("--outer-momentum", type=float, default=0.5)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--eval-batches", type=int, default=16)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--layers", type=int, default=0, help="[model] n_layers (0: the config's)")
    ap.add_argument("--fragments", type=int, default=1)
    ap.add_argument("--overlap", type=int, default=0)
    ap.add_argument("--mix", type=float, default=0.0)
    ap.add_argument("--skip", choices=["loom", "torchft"], default=None, help="run one side only")
    # a replica's own arguments (the driver starts them)
    ap.add_argument("--replica", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--lighthouse", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--init", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--final", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.steps % args.h:
        sys.exit("torchft_peer: --steps must be a multiple of --h (both sides end on a sync)")
    if args.replica is not None:
        return replica(args)

    import torch
    from safetensors.torch import load_file, save_file
    os.makedirs(args.out, exist_ok=True)
    m, _, _ = load_cfg(args)
    model = torch_lm.Llama(m)
    torch_lm.init_for_bench(model, torch.Generator().manual_seed(args.seed))
    init = os.path.join(args.out, "init.safetensors")
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, init)
    env = island_env(OMP_NUM_THREADS="1")
    result = {"steps": args.steps, "h": args.h, "islands": args.islands, "outer_lr": args.outer_lr,
              "outer_momentum": args.outer_momentum, "seed": args.seed, "layers": m.n_layers,
              "fragments": args.fragments, "overlap": args.overlap, "mix": args.mix,
              "parameters": sum(p.numel() for p in model.parameters())}

    if args.skip != "loom":
        run = os.path.join(args.out, "loom")
        subprocess.run(["rm", "-rf", run], check=True)
        cmd = [args.loom, "islands", CONFIG, "--islands", str(args.islands), "--run-dir", run]
        for s in ["model.init=" + init, "data.path=" + DATA, f"train.steps={args.steps}",
                  f"train.warmup_steps={args.warmup}", f"train.eval_batches={args.eval_batches}",
                  f"train.seed={args.seed}", f"outer.inner_steps={args.h}",
                  f"outer.lr={args.outer_lr}", f"outer.momentum={args.outer_momentum}",
                  f"model.n_layers={m.n_layers}", f"outer.fragments={args.fragments}",
                  f"outer.overlap={args.overlap}", f"outer.mix={args.mix}"]:
            cmd += ["--set", s]
        b0, t0 = lo_bytes(), time.time()
        subprocess.run(cmd, check=True, env=env, cwd=ROOT, stdout=subprocess.DEVNULL)
        wall, lo = time.time() - t0, lo_bytes() - b0
        s = json.load(open(os.path.join(run, "summary.json")))
        state = os.path.join(run, "server", "outer_state.safetensors")
        final = {k[len("param."):]: v for k, v in load_file(state).items() if k.startswith("param.")}
        result["loom"] = {"val_loss": evaluate(final, args), "val_loss_loom": s["val_loss"],
                          "wall_s": round(wall, 1), "loopback_bytes": lo,
                          "payload_bytes": s["bytes_sent"] + s["bytes_received"],
                          "rounds": s["version"]}
        print(json.dumps({"loom": result["loom"]}), flush=True)

    if args.skip != "torchft":
        from torchft._torchft import LighthouseServer
        final = os.path.join(args.out, "torchft_final.safetensors")
        lighthouse = LighthouseServer(bind="127.0.0.1:%d" % free_port(), min_replicas=args.islands)
        b0, t0 = lo_bytes(), time.time()
        procs = []
        try:
            for i in range(args.islands):
                log = open(os.path.join(args.out, "torchft_%d.log" % i), "w")
                procs.append(subprocess.Popen(
                    [sys.executable, os.path.abspath(__file__), "--replica", str(i),
                     "--lighthouse", lighthouse.address(), "--init", init, "--final", final] +
                    [x for k in ("steps", "h", "islands", "outer_lr", "outer_momentum", "warmup",
                                 "seed", "layers", "fragments", "overlap", "mix")
                     for x in ("--" + k.replace("_", "-"), str(getattr(args, k)))],
                    env=env, stdout=log, stderr=subprocess.STDOUT))
            deadline = time.time() + 4 * 3600
            for i, p in enumerate(procs):
                if p.wait(max(1, deadline - time.time())) != 0:
                    sys.exit("torchft_peer: replica %d failed (rc %d): see %s/torchft_%d.log"
                             % (i, p.returncode, args.out, i))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            lighthouse.shutdown()
        wall, lo = time.time() - t0, lo_bytes() - b0
        result["torchft"] = {"val_loss": evaluate(load_file(final), args), "wall_s": round(wall, 1),
                             "loopback_bytes": lo}
        print(json.dumps({"torchft": result["torchft"]}), flush=True)

    if "loom" in result and "torchft" in result:
        result["loom_vs_torchft_pct"] = round(
            100 * (result["loom"]["val_loss"] / result["torchft"]["val_loss"] - 1), 3)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(result))


if __name__ == "__main__":
    sys.exit(main())
