"""PyTorch's data-parallel peers over gloo: DDP for Loom's `data` plan, FSDP2 for its `fsdp` plan.

Trains a Loom config's model (bench/peer/torch_lm.py, the same definition as the golden tests) on
random tokens with N processes of T threads each, every process taking 1/N of the global batch, and
prints one JSON line (rank 0) for `bench/plan_bench.sh` to set beside Loom's figure:

    /usr/bin/python3 bench/peer/torch_dist.py configs/bench-llama.toml --wrap ddp
    $LOOM_PEER_VENV/bin/python bench/peer/torch_dist.py configs/bench-llama.toml --wrap fsdp2

The step is the idiomatic one: zero_grad, forward, loss, backward (DDP all-reduces gradient buckets
while the backward runs; FSDP2 all-gathers each block's parameters before its forward and backward
and reduce-scatters its gradients after), clip_grad_norm_, AdamW. f32 only.

`--wrap fsdp2` (PyTorch 2.x: `fully_shard` per transformer block, then the root) first checks its
gradients against one process on the whole batch and fails if they differ: gloo's reduce-scatter has
been reported to sum where it should average. If the check finds a sum, the step forces sum reduction
(`set_force_sum_reduction_for_comms`) and divides the gradients explicitly, and says so in its JSON.
Only /usr/bin/python3 imports Debian's PyTorch (1.13: DDP only; its FSDP runs only on CUDA).
"""
import argparse
import json
import os
import resource
import socket
import sys


def parse_cli(argv):
    p = argparse.ArgumentParser(description="PyTorch DDP or FSDP2 (gloo) on a Loom config; one JSON line.")
    p.add_argument("config")
    p.add_argument("--wrap", choices=["ddp", "fsdp2"], default="ddp")
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

# FSDP2 gradients against one process: relative max-norm error allowed (f32, a different order of
# summation over the batch).
GRAD_RTOL = 1e-4


def blocks(model):
    """The transformer blocks, FSDP2's unit of sharding (one all-gather per block)."""
    return model.model.layers if hasattr(model, "model") else model.h


def local_grads(model):
    """{name: full gradient} on every rank (DTensor gradients gathered)."""
    out = {}
    for name, p in model.named_parameters():
        g = p.grad
        out[name] = g.full_tensor() if hasattr(g, "full_tensor") else g
    return out


def fsdp2_grad_errors(model, reference, inputs, targets, ranks):
    """One forward and backward of the sharded model on this rank's slice; returns the largest
    relative error of its gradients against `reference` (the one-process gradients of the whole
    batch) as they are, and divided by `ranks` (what a reduce-scatter that sums would need)."""
    torch_lm.lm_loss(model(inputs), targets).backward()
    got = local_grads(model)
    as_is, divided = 0.0, 0.0
    for name, ref in reference.items():
        scale = ref.norm().item() or 1.0
        as_is = max(as_is, (got[name] - ref).norm().item() / scale)
        divided = max(divided, (got[name] / ranks - ref).norm().item() / scale)
    model.zero_grad(set_to_none=True)
    return as_is, divided


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
    modern = torch_lm.torch_major() >= 2
    g = torch.Generator().manual_seed(args.seed)
    model = torch_lm.build_model(m, sdpa=modern and torch_lm.has_sdpa())
    torch_lm.init_for_bench(model, g)  # same init on every rank (same seed)
    batch = torch.randint(0, m.vocab_size, (B, T + 1), generator=g)
    local = batch[rank * B // args.ranks:(rank + 1) * B // args.ranks]
    inputs, targets = local[:, :-1], local[:, 1:]
    extra = {}

    if args.wrap == "ddp":
        forward = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch_lm.make_adamw(model, cfg.optim, fused=True if modern else None)
        after_backward = None
    else:
        from torch.distributed.fsdp import fully_shard
        # the reference: one process, the whole batch, the same weights
        model.zero_grad(set_to_none=True)
        torch_lm.lm_loss(model(batch[:, :-1]), batch[:, 1:]).backward()
        reference = {n: p.grad.clone() for n, p in model.named_parameters()}
        model.zero_grad(set_to_none=True)
        for block in blocks(model):
            fully_shard(block)
        fully_shard(model)
        as_is, divided = fsdp2_grad_errors(model, reference, inputs, targets, args.ranks)
        sums = as_is >= GRAD_RTOL > divided
        divide = 1.0
        if sums:  # gloo summed: force the sum everywhere and divide once, explicitly
            model.set_force_sum_reduction_for_comms(True)
            divide = float(args.ranks)
            _, as_is = fsdp2_grad_errors(model, reference, inputs, targets, args.ranks)
        if as_is >= GRAD_RTOL:
            raise RuntimeError(f"FSDP2 gradients differ from one process's: relative error {as_is:.3g}"
                               f" (allowed {GRAD_RTOL})")
        extra = {"grad_check_rel_err": as_is, "grad_sum_workaround": sums}
        opt = torch.optim.AdamW(  # DTensor parameters: foreach, PyTorch's default for them
            [{"params": [p for p in model.parameters() if p.ndim >= 2],
              "weight_decay": cfg.optim.weight_decay},
             {"params": [p for p in model.parameters() if p.ndim < 2], "weight_decay": 0.0}],
            lr=cfg.optim.lr, betas=(cfg.optim.beta1, cfg.optim.beta2), eps=1e-8)
        forward = model
        after_backward = (lambda: [p.grad.div_(divide) for p in model.parameters()]) if sums else None

    step = torch_lm.make_step(forward, model, opt, inputs, targets, cfg.optim.grad_clip,
                              after_backward=after_backward)
    times, loss = torch_lm.time_steps(step, args.warmup, args.steps, before=dist.barrier)
    rss = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024],
                       dtype=torch.int64)
    all_rss = [torch.zeros_like(rss) for _ in range(args.ranks)]
    dist.all_gather(all_rss, rss)
    if rank == 0:
        queue.put({
            "peer": f"pytorch-{args.wrap}-gloo",
            **torch_lm.result_fields(m, B, T, model, times, loss, args),
            "dtype": "f32",
            "ranks": args.ranks,
            "threads_per_rank": torch.get_num_threads(),
            "per_rank_peak_rss_bytes": [int(x.item()) for x in all_rss],
            "attention": "sdpa" if modern and torch_lm.has_sdpa() else "naive_masked_softmax",
            **extra,
        })
    dist.barrier()  # no rank tears gloo down while another still talks (seen: SIGABRT at exit)
    dist.destroy_process_group()


def main():
    if ARGS.wrap == "fsdp2" and torch_lm.torch_major() < 2:
        print(f"error: --wrap fsdp2 needs PyTorch 2.x (fully_shard); this is {torch.__version__}\n"
              "hint: run it with the peer venv's python (bench/peer/setup_venv.sh)", file=sys.stderr)
        sys.exit(2)
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
