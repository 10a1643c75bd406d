"""PyTorch DistributedDataParallel over gloo: the peer for Loom's `data` and `fsdp` plans.

Trains a Loom config's model (bench/peer/torch_lm.py, the same definition as the golden tests) on
random tokens with N processes of T threads each, every process taking 1/N of the global batch, and
prints one JSON line (rank 0) for `bench/plan_bench.sh` to set beside Loom's figure:

    /usr/bin/python3 bench/peer/torch_ddp.py configs/bench-llama.toml --ranks 2 --threads 1

The step is the idiomatic one: zero_grad, forward, loss, backward (DDP all-reduces gradient buckets
while the backward runs), clip_grad_norm_, AdamW. What it deliberately does not do: no FSDP (Debian's
PyTorch 1.13 runs FSDP only on CUDA), no torch.compile, no mixed precision (f32 only).
Only /usr/bin/python3 imports Debian's PyTorch.
"""
import argparse
import json
import os
import resource
import socket
import statistics
import sys


def parse_cli(argv):
    p = argparse.ArgumentParser(description="PyTorch DDP (gloo) on a Loom config; one JSON line.")
    p.add_argument("config")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="threads per rank")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


ARGS = parse_cli(sys.argv[1:])
os.environ["OPENBLAS_NUM_THREADS"] = str(ARGS.threads)
os.environ["OMP_NUM_THREADS"] = str(ARGS.threads)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import torch_lm  # noqa: E402


def worker(rank, args, port, queue):
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=args.ranks)
    cfg = torch_lm.load_config(args.config)
    m = cfg.model
    B, T = cfg.train.batch_size, cfg.train.seq_len
    if B % args.ranks:
        raise torch_lm.ConfigError(f"{args.config}: [train] batch_size = {B} is not divisible by "
                                   f"--ranks {args.ranks}\nhint: choose a divisor")
    g = torch.Generator().manual_seed(args.seed)
    model = torch_lm.build_model(m)
    torch_lm.init_for_bench(model, g)  # same init on every rank (same seed)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch_lm.make_adamw(model, cfg.optim)
    batch = torch.randint(0, m.vocab_size, (B, T + 1), generator=g)
    local = batch[rank * B // args.ranks:(rank + 1) * B // args.ranks]
    inputs, targets = local[:, :-1], local[:, 1:]

    step = torch_lm.make_step(ddp, model, opt, inputs, targets, cfg.optim.grad_clip)
    times, loss = torch_lm.time_steps(step, args.warmup, args.steps, before=dist.barrier)
    rss = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024],
                       dtype=torch.int64)
    all_rss = [torch.zeros_like(rss) for _ in range(args.ranks)]
    dist.all_gather(all_rss, rss)
    if rank == 0:
        median = statistics.median(times)
        queue.put({
            "peer": "pytorch-ddp-gloo",
            "torch_version": torch.__version__,
            "arch": m.arch,
            "dtype": "f32",
            "ranks": args.ranks,
            "threads_per_rank": torch.get_num_threads(),
            "batch_size": B,
            "seq_len": T,
            "params": sum(p.numel() for p in model.parameters()),
            "tokens_per_s": B * T / median,
            "step_ms": {"median": median * 1e3, "min": min(times) * 1e3, "max": max(times) * 1e3},
            "per_rank_peak_rss_bytes": [int(x.item()) for x in all_rss],
            "steps": args.steps,
            "warmup": args.warmup,
            "blas": torch_lm.blas_library(),
            "final_loss": loss,
        })
    dist.destroy_process_group()


def main():
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, ARGS, port, queue)) for r in range(ARGS.ranks)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=1800)
    if any(p.exitcode != 0 for p in procs):
        print(f"error: a rank exited with {[p.exitcode for p in procs]}", file=sys.stderr)
        sys.exit(1)
    print(json.dumps(queue.get(timeout=10)))


if __name__ == "__main__":
    main()
