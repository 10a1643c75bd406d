#!/usr/bin/env python3
"""The simulator against this machine: `loom bench` and `loom plan` side by side.

  bench/sim_bench.py [--loom build/release/tools/loom/loom] [--cluster clusters/local.toml]
                     [--steps 4] [--warmup 1] [--only NAME ...] [--rounds 1] [--peer NAME]
                     [--json out.jsonl]

For every case (config, dtype, plan, passes, launcher) it measures the median step time and the
peak RSS (the largest rank's) with `loom bench`, predicts both with `loom plan` on the cluster file,
and prints a table with the errors, their mean and their maximum. Memory is compared where a rank is
a process (one process, or mpirun), not for ranks = "local" (threads of one process). Timing is
never asserted: this is a benchmark, run by hand (docs/benchmarks.md#simulator).

With --rounds R the cases are measured R times, alternated (every case once per round, so all see
the host's speed of that round), and a case's measured time is the median of its rounds' medians.
With --peer NAME every case is also compared as a ratio to that case of the same run (predicted
over the peer's prediction against measured over the peer's measurement), which cancels a host
that runs faster or slower than when it was calibrated.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DATA = '{kind="data",axis="data"}'
FSDP = '[{kind="fsdp",axis="data"},%s]' % DATA
MEGATRON = '[{kind="megatron",axis="model"}]'
FSDP_MEGATRON = '[{kind="megatron",axis="model"},{kind="fsdp",axis="data"},%s]' % DATA


def pipeline(schedule, microbatches):
    return '[{kind="pipeline",axis="pipe",schedule="%s",microbatches=%d}]' % (schedule, microbatches)


def plan(mesh, tactics, ranks="mpi"):
    return ["plan.mesh=" + mesh, "plan.tactics=" + tactics, "plan.ranks=" + ranks]


# name, config, sets, launcher ("one" | "mpi"), ranks, threads per rank
CASES = [
    ("llama-one-2t", "bench-llama", [], "one", 1, 2),
    ("llama-bf16-one-2t", "bench-llama", ["model.dtype=bf16"], "one", 1, 2),
    ("gpt2-one-2t", "bench-gpt2", [], "one", 1, 2),
    ("llama-data-mpi2", "bench-llama", plan("{data=2}", "[%s]" % DATA), "mpi", 2, 1),
    ("llama-fsdp-mpi2", "bench-llama", plan("{data=2}", FSDP), "mpi", 2, 1),
    ("llama-fsdp-nopasses-mpi2", "bench-llama",
     plan("{data=2}", FSDP) + ["passes.prefetch=false", "passes.bucket=none"], "mpi", 2, 1),
    ("llama-bf16-fsdp-mpi2", "bench-llama", plan("{data=2}", FSDP) + ["model.dtype=bf16"], "mpi", 2, 1),
    # the same rows per step as llama-fsdp-mpi2, in 2 micro-batches of 4 (gradient accumulation)
    ("llama-fsdp-accum2-mpi2", "bench-llama",
     plan("{data=2}", FSDP) + ["train.batch_size=4", "train.grad_accum=2"], "mpi", 2, 1),
    ("llama-megatron-mpi2", "bench-llama", plan("{model=2}", MEGATRON), "mpi", 2, 1),
    ("gpt2-fsdp-mpi2", "bench-gpt2", plan("{data=2}", FSDP), "mpi", 2, 1),
    ("gpt2-bf16-data-mpi2", "bench-gpt2", plan("{data=2}", "[%s]" % DATA) + ["model.dtype=bf16"],
     "mpi", 2, 1),
    ("gpt2-megatron-mpi2", "bench-gpt2", plan("{model=2}", MEGATRON), "mpi", 2, 1),
    ("llama-fsdp-local2", "bench-llama", plan("{data=2}", FSDP, "local"), "one", 2, 1),
    ("llama-fsdp-megatron-mpi4", "bench-llama", plan("{data=2,model=2}", FSDP_MEGATRON), "mpi", 4, 1),
    ("llama-fsdp-megatron-local4", "bench-llama", plan("{data=2,model=2}", FSDP_MEGATRON, "local"),
     "one", 4, 1),
] + [
    # two pipeline stages over the same global batch as llama-data-mpi2 (bench/pipeline_bench.sh)
    ("llama-%s-%d-mpi2" % (s, m), "bench-llama", plan("{pipe=2}", pipeline(s, m)), "mpi", 2, 1)
    for s in ("gpipe", "1f1b", "interleaved") for m in (2, 4, 8)
]


def run(cmd, env):
    r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("failed: %s\n%s" % (" ".join(cmd), r.stderr[-3000:]))
    return r.stdout


def last_json(text):
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    sys.exit("no JSON in:\n" + text[-2000:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loom", default=os.path.join(ROOT, "build/release/tools/loom/loom"))
    ap.add_argument("--cluster", default="clusters/local.toml")
    ap.add_argument("--cluster-2t", default=None,
                    help="cluster file calibrated with 2 threads, for the one-rank 2-thread cases")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--peer", help="a case every other is also compared to as a ratio")
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.rounds < 1:
        sys.exit("--rounds must be at least 1")
    names = [c[0] for c in CASES]
    for n in (a.only or []) + ([a.peer] if a.peer else []):
        if n not in names:
            sys.exit("no case %s (cases: %s)" % (n, " ".join(names)))
    # per case, once: its cluster file, environment, prediction and loom bench command
    cases, preds, benches, measured = [], {}, {}, {}
    for name, cfg, sets, launcher, ranks, threads in CASES:
        if a.only and name not in a.only and name != a.peer:
            continue
        config = "configs/%s.toml" % cfg
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), OMP_WAIT_POLICY="passive")
        cluster = a.cluster_2t if threads == 2 and a.cluster_2t else a.cluster
        setargs = sum([["--set", s] for s in sets], [])
        preds[name] = last_json(run([a.loom, "plan", config, "--cluster", cluster, "--json"] + setargs,
                                    env))
        bench = [a.loom, "bench", config, "--steps", str(a.steps), "--warmup", str(a.warmup)] + setargs
        if launcher == "mpi":
            bench = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np",
                     str(ranks), "-x", "OMP_NUM_THREADS", "-x", "OMP_WAIT_POLICY"] + bench
        benches[name] = (bench, env)
        measured[name] = []
        cases.append((name, launcher, ranks, threads, cluster))
    for rnd in range(a.rounds):
        for name, *_ in cases:
            meas = last_json(run(*benches[name]))
            measured[name].append(meas)
            print("round %d  %-28s measured %8.1f ms" % (rnd + 1, name, meas["step_ms"]["median"]),
                  file=sys.stderr, flush=True)
    rows = []
    for name, launcher, ranks, threads, cluster in cases:
        pred, runs = preds[name], measured[name]
        step = statistics.median(m["step_ms"]["median"] for m in runs)
        rss = statistics.median(max(r["peak_rss_bytes"] for r in m["per_rank"]) for m in runs)
        row = {"case": name, "measured_ms": step, "predicted_ms": pred["step_ms"],
               "time_error": pred["step_ms"] / step - 1,
               "measured_ms_per_round": [m["step_ms"]["median"] for m in runs],
               "measured_exposed_ms": statistics.median(m.get("exposed_comm_ms") or 0 for m in runs),
               # loom bench's is the mean over ranks; a pipeline's stages each predict their own
               "predicted_exposed_ms": (statistics.mean(s["exposed_comm_ms"] for s in pred["stages"])
                                        if pred.get("stages") else pred["exposed_comm_ms"]),
               "threads": threads, "cluster": cluster}
        if ranks == 1 or launcher == "mpi":
            row.update({"measured_rss": rss, "predicted_peak": pred["peak_bytes"],
                        "memory_error": pred["peak_bytes"] / rss - 1})
        rows.append(row)
    peer = next((r for r in rows if r["case"] == a.peer), None)
    for row in rows:
        if peer:
            row["predicted_over_peer"] = row["predicted_ms"] / peer["predicted_ms"]
            row["measured_over_peer"] = row["measured_ms"] / peer["measured_ms"]
            row["ratio_error"] = row["predicted_over_peer"] / row["measured_over_peer"] - 1
        mem = ("%+6.1f%%" % (100 * row["memory_error"])) if "memory_error" in row else "   n/a"
        ratio = ("   over %s %+6.1f%%" % (a.peer, 100 * row["ratio_error"])) if peer else ""
        print("%-28s measured %8.1f ms  predicted %8.1f ms  %+6.1f%%   exposed %6.1f / %6.1f ms"
              "   memory %s%s" %
              (row["case"], row["measured_ms"], row["predicted_ms"], 100 * row["time_error"],
               row["measured_exposed_ms"], row["predicted_exposed_ms"], mem, ratio), flush=True)
    if not rows:
        return
    te = [abs(r["time_error"]) for r in rows]
    me = [abs(r["memory_error"]) for r in rows if "memory_error" in r]
    print("step time: mean |error| %.1f%%, max %.1f%% over %d cases" %
          (100 * statistics.mean(te), 100 * max(te), len(te)))
    if me:
        print("peak memory: mean |error| %.1f%%, max %.1f%% over %d cases" %
              (100 * statistics.mean(me), 100 * max(me), len(me)))
    if peer and len(rows) > 1:
        re = [abs(r["ratio_error"]) for r in rows if r is not peer]
        print("step time over %s's: mean |error| %.1f%%, max %.1f%% over %d cases" %
              (a.peer, 100 * statistics.mean(re), 100 * max(re), len(re)))
    if a.json:
        with open(a.json, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
