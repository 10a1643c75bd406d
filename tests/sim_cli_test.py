#!/usr/bin/env python3
"""loom plan and loom calibrate (the simulator, docs/simulator.md): calibrate --quick writes a cluster
file that loom plan reads back; loom plan prints a table, or one JSON line per plan with the keys the
docs promise, on this machine's cluster, on the shipped GPU clusters and for --compare files; a
paper-scale model compiles and simulates with no tensor allocated; bad input (a missing or broken
cluster file, a mesh the devices cannot hold, an axis no level can hold, a bad --compare file) is a
clear error naming the file and key, exit 1. Loom's own kernels (loom bench --kernels-out) as a
cluster's profile that loom plan predicts the step from. GPU timings' round trip: loom plan --kernels lists
the program's kernels (their predicted times add up to the compute stream's), kernels timed at twice
those times and brought back by calibrate --import predict twice the compute time, the timing
scripts of bench/gpu run on the CPU under Debian's PyTorch, and a broken timings file is an error
naming the file and entry.

    sim_cli_test.py LOOM_BINARY SOURCE_DIR
"""
import json
import os
import subprocess
import sys
import tempfile
import tomllib

from checks import Checks

LOOM, SRC = sys.argv[1], sys.argv[2]
checks = Checks()
check = checks.check
ENV = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="passive")
FSDP = ["--set", "plan.mesh={data=2}",
        "--set", 'plan.tactics=[{kind="fsdp",axis="data"},{kind="data",axis="data"}]']
KEYS = ["step_ms", "tokens_per_s_per_device", "mfu", "hfu", "peak_bytes", "fits", "exposed_comm_ms",
        "bytes_per_level", "bytes_per_axis", "energy_kwh_per_step", "co2_kg_per_step"]


def loom(*args):
    return subprocess.run([LOOM, *args], cwd=SRC, env=ENV, capture_output=True, text=True)


def cfg(name):
    return os.path.join(SRC, "configs", name)


def cluster(name):
    return os.path.join(SRC, "clusters", name)


def json_lines(r):
    return [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")]


with tempfile.TemporaryDirectory() as tmp:
    quick = os.path.join(tmp, "quick.toml")
    r = loom("calibrate", "--quick", "--out", quick)
    check("calibrate --quick writes a cluster file", r.returncode == 0 and os.path.exists(quick),
          r.stderr[-2000:])
    text = open(quick).read() if os.path.exists(quick) else ""
    check("it holds a measured profile", "[profile]" in text and "matmul = [" in text
          and "[profile.comm]" in text and "rank_runtime_bytes" in text, text[:2000])

    r = loom("plan", cfg("tiny-llama.toml"), "--cluster", quick, "--json", *FSDP)
    rows = json_lines(r)
    check("plan reads calibrate's file back: one JSON line with every key",
          r.returncode == 0 and len(rows) == 1 and all(k in rows[0] for k in KEYS), r.stderr + r.stdout)
    if rows:
        p = rows[0]
        check("its numbers are sane", p["step_ms"] > 0 and 0 < p["mfu"] < 1 and p["fits"]
              and p["bytes_per_axis"].get("data", 0) > 0 and p["devices"] == 2, json.dumps(p))
        by_op = p.get("compute_ms_by_op", {})
        check("compute time per op adds up to compute_ms, matmul among it",
              by_op.get("matmul", 0) > 0
              and abs(sum(by_op.values()) - p["compute_ms"]) <= 1e-6 * p["compute_ms"],
              json.dumps(by_op))

    r = loom("plan", cfg("tiny-llama.toml"), "--cluster", cluster("local.toml"))
    check("the table on the shipped local cluster, one process",
          r.returncode == 0 and "step ms" in r.stdout and "config" in r.stdout, r.stderr + r.stdout)

    # a plan file to compare
    plans = os.path.join(tmp, "plans.toml")
    with open(plans, "w") as f:
        f.write('[[plan]]\nname = "fsdp8"\nmesh = { data = 8 }\n'
                'tactics = [{ kind = "fsdp", axis = "data" }, { kind = "data", axis = "data" }]\n'
                '[[plan]]\nname = "tp8"\nmesh = { model = 8 }\n'
                'tactics = [{ kind = "megatron", axis = "model" }]\n'
                'passes = { recompute = "full" }\n')
    r = loom("plan", cfg("bench-llama.toml"), "--cluster", cluster("h100-sxm.toml"), "--compare",
             plans, "--json")
    rows = json_lines(r)
    check("--compare: one line per [[plan]] on 8 H100s",
          r.returncode == 0 and [x["plan"] for x in rows] == ["fsdp8", "tp8"]
          and all(x["devices"] == 8 for x in rows), r.stderr + r.stdout)
    if len(rows) == 2:
        check("NVLink carries the traffic", all("nvlink" in x["bytes_per_level"] for x in rows),
              json.dumps(rows))

    r = loom("plan", cfg("llama3.1-8b.toml"), "--cluster", cluster("h100-sxm.toml"), "--json",
             "--set", "plan.mesh={data=8}",
             "--set", 'plan.tactics=[{kind="fsdp",axis="data"},{kind="data",axis="data"}]',
             "--set", "train.batch_size=16", "--set", "passes.recompute=selective")
    rows = json_lines(r)
    check("Llama 3.1 8B, FSDP on 8 H100: predicted without tensors",
          r.returncode == 0 and len(rows) == 1 and 0 < rows[0]["mfu"] < 1
          # f32 master weights and two moments, split 8 ways, at least
          and rows[0]["peak_bytes"] > 8.0e9 * 12 / 8,
          r.stderr[-2000:] + r.stdout)

    # bad input
    r = loom("plan", cfg("tiny-llama.toml"), "--cluster", os.path.join(tmp, "none.toml"))
    check("a missing cluster file: exit 1 naming it", r.returncode == 1 and "none.toml" in r.stderr,
          r.stderr)
    bad = os.path.join(tmp, "bad.toml")
    with open(bad, "w") as f:
        f.write(open(cluster("h100-sxm.toml")).read().replace("memory_bytes", "memory_byte"))
    r = loom("plan", cfg("tiny-llama.toml"), "--cluster", bad)
    check("an unknown key: exit 1 naming the file and key",
          r.returncode == 1 and "bad.toml" in r.stderr and "memory_byte" in r.stderr
          and "did you mean" in r.stderr, r.stderr)
    r = loom("plan", cfg("tiny-llama.toml"), "--cluster", cluster("h100-sxm.toml"), "--devices", "1",
             *FSDP)
    check("a mesh larger than the devices: exit 1", r.returncode == 1 and "devices" in r.stderr,
          r.stderr)
    one_level = os.path.join(tmp, "one_level.toml")
    with open(one_level, "w") as f:
        t = open(cluster("h100-sxm.toml")).read()
        f.write(t[:t.index('[[level]]\nname = "ib"')])
    r = loom("plan", cfg("tiny-llama.toml"), "--cluster", one_level,
             "--set", "plan.mesh={data=16}", "--set", 'plan.tactics=[{kind="data",axis="data"}]',
             "--set", "train.batch_size=16")
    check("an axis no level holds: exit 1 naming the axis",
          r.returncode == 1 and "one_level.toml" in r.stderr and "axis data spans 16" in r.stderr,
          r.stderr)
    with open(plans, "w") as f:
        f.write('[[plan]]\nname = "x"\nmesh = { data = 2 }\ncolour = 1\n')
    r = loom("plan", cfg("tiny-llama.toml"), "--compare", plans)
    check("a --compare file with an unknown key: exit 1 naming it",
          r.returncode == 1 and "colour" in r.stderr and "plans.toml" in r.stderr, r.stderr)

    # ranks that compiled different collectives (here: two configs that differ in [passes] bucket,
    # as two hosts with different cluster files could under bucket = "auto") stop with a message
    # naming the rank, never hang
    plan = ("\n[plan]\nmesh = { data = 2 }\n"
            'tactics = [{ kind = "fsdp", axis = "data" }, { kind = "data", axis = "data" }]\n')
    base = open(cfg("tiny-llama.toml")).read()
    a_cfg, b_cfg = os.path.join(tmp, "a.toml"), os.path.join(tmp, "b.toml")
    with open(a_cfg, "w") as f:
        f.write(base + plan + '[passes]\nbucket = "block"\n')
    with open(b_cfg, "w") as f:
        f.write(base + plan + '[passes]\nbucket = "none"\n')
    mpi = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-x",
           "OMP_NUM_THREADS", "-x", "OMP_WAIT_POLICY"]
    try:
        r = subprocess.run(mpi + ["-np", "1", LOOM, "bench", a_cfg, "--steps", "1", "--warmup", "0",
                                  ":", "-np", "1", LOOM, "bench", b_cfg, "--steps", "1", "--warmup",
                                  "0"], env=ENV, capture_output=True, text=True, timeout=120)
        out = r.stdout + r.stderr
        check("ranks with different programs: a clear error naming the rank, no hang",
              r.returncode != 0 and "rank 1 compiled other collectives than rank 0" in out,
              out[-2000:])
    except subprocess.TimeoutExpired:
        check("ranks with different programs: a clear error naming the rank, no hang", False,
              "mpirun hung for 120 s")

with tempfile.TemporaryDirectory() as tmp:
    kernels, timed = os.path.join(tmp, "k.json"), os.path.join(tmp, "t.json")
    h100 = cluster("h100-sxm.toml")
    args = [cfg("tiny-llama.toml"), "--cluster", h100, "--json", *FSDP,
            "--set", "model.dtype=bf16", "--set", "passes.recompute=selective"]
    r = loom("plan", *args, "--kernels", kernels)
    rows = json_lines(r)
    doc = json.load(open(kernels)) if os.path.exists(kernels) else {"kernels": []}
    ks = doc["kernels"]
    check("plan --kernels writes the program's distinct kernels",
          r.returncode == 0 and len(rows) == 1 and len(ks) > 10
          and all(all(f in k for f in ("op", "attrs", "inputs", "outputs", "count", "bytes", "flops",
                                       "dtype", "predicted_s")) for k in ks)
          and any("gemm" in k for k in ks) and {"attention", "rmsnorm", "adamw"} <= {k["op"] for k in ks},
          r.stderr[-2000:])
    if rows and ks:
        total = sum(k["count"] * k["predicted_s"] for k in ks) * 1e3
        check("their predicted times add up to the compute stream's",
              abs(total - rows[0]["compute_ms"]) <= 1e-6 * rows[0]["compute_ms"],
              f"{total} vs {rows[0]['compute_ms']}")
        json.dump({"device": "test", "torch": "none",
                   "kernels": [dict(k, seconds=2 * k["predicted_s"]) for k in ks]}, open(timed, "w"))
        out = os.path.join(tmp, "measured.toml")
        r = loom("calibrate", "--import", timed, "--base", h100, "--out", out)
        check("calibrate --import writes the base cluster with the timings as its profile",
              r.returncode == 0 and "[profile]" in open(out).read()
              and 'name = "h100-sxm-measured"' in open(out).read(), r.stderr[-2000:])
        r2 = loom("plan", *args[:1], "--cluster", out, *args[3:])
        rows2 = json_lines(r2)
        check("timings of twice the predicted times predict twice the compute time",
              r2.returncode == 0 and len(rows2) == 1
              and abs(rows2[0]["compute_ms"] - 2 * rows[0]["compute_ms"]) <= 1e-6 * rows[0]["compute_ms"],
              r2.stderr[-2000:] + str(rows2 and rows2[0]["compute_ms"]) + " " + str(rows[0]["compute_ms"]))

        # bench/gpu's scripts on this CPU with Debian's PyTorch (the GPU run's code path, small)
        torch_py = "/usr/bin/python3"
        cpu_timed = os.path.join(tmp, "cpu.json")
        r = subprocess.run([torch_py, os.path.join(SRC, "bench", "gpu", "torch_kernels.py"), kernels,
                            "--out", cpu_timed, "--device", "cpu"], env=ENV, capture_output=True,
                           text=True)
        got = json.load(open(cpu_timed))["kernels"] if os.path.exists(cpu_timed) else []
        check("torch_kernels.py times every kernel with a PyTorch mapping (none as a plain copy)",
              r.returncode == 0 and len(got) == len(ks)
              and all(k["how"] == "torch" and k["seconds"] > 0 for k in got),
              r.stdout[-1500:] + r.stderr[-1500:])
        r = loom("calibrate", "--import", cpu_timed, "--base", h100, "--out", out)
        check("its output imports", r.returncode == 0, r.stderr[-1000:])
        r = subprocess.run([torch_py, os.path.join(SRC, "bench", "gpu", "torch_step.py"),
                            cfg("tiny-llama.toml"), "--device", "cpu", "--ac", "none", "--steps", "2",
                            "--warmup", "1"], env=ENV, capture_output=True, text=True)
        step = json.loads(r.stdout) if r.returncode == 0 and r.stdout.startswith("{") else {}
        check("torch_step.py runs a step and reports its time",
              step.get("step_ms", 0) > 0 and step.get("layers") == 2, r.stdout[-1000:] + r.stderr[-1500:])

    # Loom's own kernels: loom bench --kernels-out times the step's program as it runs, calibrate
    # --import makes them a cluster's profile, and loom plan predicts the same program from them
    own, listed = os.path.join(tmp, "own.json"), os.path.join(tmp, "listed.json")
    own_toml, local = os.path.join(tmp, "own.toml"), cluster("local.toml")
    one = [cfg("tiny-llama.toml"), "--set", "model.dtype=bf16"]
    r = loom("bench", *one, "--steps", "2", "--warmup", "1", "--kernels-out", own)
    mine = json.load(open(own)) if os.path.exists(own) else {"kernels": []}
    r2 = loom("plan", one[0], "--cluster", local, "--json", *one[1:], "--kernels", listed)
    want = json.load(open(listed))["kernels"] if os.path.exists(listed) else []

    def sig(k):
        return json.dumps({f: k[f] for f in ("op", "attrs", "inputs", "outputs")}, sort_keys=True)

    check("bench --kernels-out times every kernel loom plan lists for the step, as many a step",
          r.returncode == 0 and r2.returncode == 0 and len(want) > 10
          and {sig(k): k["count"] for k in mine["kernels"]} == {sig(k): k["count"] for k in want}
          and all(k["seconds"] > 0 for k in mine["kernels"])
          and "Loom's own kernels" in mine.get("source", ""),
          r.stderr[-1500:] + r2.stderr[-1500:])
    r = loom("calibrate", "--import", own, "--base", local, "--out", own_toml)
    check("calibrate --import of Loom's own kernels names them in the cluster file",
          r.returncode == 0 and "Loom's own kernels" in open(own_toml).read(), r.stderr[-1500:])
    if r.returncode == 0 and mine["kernels"]:
        rows = json_lines(loom("plan", one[0], "--cluster", own_toml, "--json", *one[1:]))
        total = sum(k["count"] * k["seconds"] for k in mine["kernels"]) * 1e3
        check("loom plan on that cluster predicts the step's compute from the kernels measured",
              len(rows) == 1 and abs(rows[0]["compute_ms"] - total) <= 0.1 * total,
              f"{rows and rows[0]['compute_ms']} vs {total}")
    r = loom("bench", *one, "--steps", "1", "--kernels-out", os.path.join(tmp, "no", "k.json"))
    check("bench --kernels-out into a missing directory: exit 1 before any step, naming the flag",
          r.returncode == 1 and "--kernels-out" in r.stderr and "does not exist" in r.stderr,
          r.stderr[-1000:])
    # gradient accumulation: a micro-batch's kernels run grad_accum times a step, the optimizer's
    # once, in what bench measures and in what plan lists
    accum = one + ["--set", "train.grad_accum=3"]
    r = loom("bench", *accum, "--steps", "2", "--warmup", "1", "--kernels-out", own)
    mine = json.load(open(own)) if r.returncode == 0 else {"kernels": []}
    r2 = loom("plan", accum[0], "--cluster", local, "--json", *accum[1:], "--kernels", listed)
    want = json.load(open(listed))["kernels"] if r2.returncode == 0 else []
    counts = {sig(k): k["count"] for k in mine["kernels"]}
    check("with grad_accum = 3, bench --kernels-out and plan --kernels count every kernel alike "
          "(the loss 3 times a step, the clipping once)",
          r.returncode == 0 and r2.returncode == 0 and len(want) > 10
          and counts == {sig(k): k["count"] for k in want}
          and [k["count"] for k in mine["kernels"] if k["op"] == "cross_entropy"] == [3]
          and [k["count"] for k in mine["kernels"] if k["op"] == "clip_coef"] == [1],
          r.stderr[-1500:] + r2.stderr[-1500:])

    def bad_import(text, want, name):
        path = os.path.join(tmp, "bad.json")
        with open(path, "w") as f:
            f.write(text)
        r = loom("calibrate", "--import", path, "--base", h100, "--out", os.path.join(tmp, "x.toml"))
        check(name, r.returncode == 1 and "bad.json" in r.stderr and want in r.stderr
              and not os.path.exists(os.path.join(tmp, "x.toml")), r.stderr)

    bad_import("[1, 2]", "kernels", "--import of a file without kernels: exit 1 naming it")
    bad_import('{"kernels": [{"op": "add", "dtype": "f32", "bytes": 8, "flops": 0, "seconds": -1}]}',
               "kernels[0]: seconds", "--import with a negative time: exit 1 naming the entry and key")
    bad_import('{"kernels": [{"op": "add", "dtype": "f64", "bytes": 8, "flops": 0, "seconds": 1}]}',
               "kernels[0]: dtype", "--import with an unknown dtype: exit 1 naming the entry")
    bad_import("{", "not valid JSON", "--import of broken JSON: exit 1 naming the file")
    bad_import('{"device": 5, "kernels": [{"op": "add", "dtype": "f32", "bytes": 8, "flops": 0, '
               '"seconds": 1}]}', "device: expected a string",
               "--import with a device that is not a string: exit 1 naming the key")
    bad_import('{"kernels": [{"op": "matmul", "dtype": "f32", "seconds": 1, "gemm": {"ta": 0, '
               '"tb": 0, "m": 8, "n": 8, "k": 8, "batch": 1e30}}]}', "kernels[0]: gemm.batch",
               "--import with a GEMM batch beyond any integer: exit 1 naming the entry and key")
    r = loom("calibrate", "--import", timed, "--base", h100)
    check("--import without --out: exit 1 (never over clusters/local.toml)",
          r.returncode == 1 and "--out" in r.stderr, r.stderr)
    r = loom("calibrate", "--import", timed, "--out", os.path.join(tmp, "y.toml"))
    check("--import without --base: exit 1", r.returncode == 1 and "--base" in r.stderr, r.stderr)

# loom calibrate --level: a network level measured by ranks of an MPI job (here shared memory, 2
# ranks of this machine) replaces the base's level of that name; bad input names the flag, the
# launcher or why the ranks cannot measure the level
with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "level.toml")
    launcher = "mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2"
    base = cluster("local.toml")
    r = loom("calibrate", "--level", "shm", "--launcher", launcher, "--base", base, "--out", out,
             "--quick")
    ok = r.returncode == 0 and os.path.exists(out)
    check("calibrate --level shm under mpirun: exit 0 and a cluster file", ok, r.stderr[-2000:])
    if ok:
        lv = tomllib.load(open(out, "rb"))["level"]
        shm = lv[0] if lv else {}
        check("the level is measured: a bandwidth, a latency and overlap factors >= 1",
              shm.get("name") == "shm" and shm.get("bandwidth", 0) > 1e6
              and shm.get("latency", 0) > 0 and shm.get("comm_beside_compute", 1) >= 1
              and shm.get("compute_beside_comm", 1) >= 1, str(shm))
        r = loom("plan", cfg("tiny-llama.toml"), "--cluster", out, "--json", *FSDP)
        check("plan reads the calibrated level back", r.returncode == 0 and json_lines(r),
              r.stderr[-1000:])
    r = loom("calibrate", "--level", "shm", "--base", base, "--out", out)
    check("--level without --launcher: exit 1 naming it",
          r.returncode == 1 and "--launcher" in r.stderr, r.stderr)
    r = loom("calibrate", "--level", "shm", "--launcher", launcher, "--out", out)
    check("--level without --base: exit 1 naming it", r.returncode == 1 and "--base" in r.stderr,
          r.stderr)
    r = loom("calibrate", "--level", "shm", "--launcher", "false", "--base", base, "--out", out)
    check("a launcher that fails: exit 1 naming it",
          r.returncode == 1 and "the ranks failed" in r.stderr and "false" in r.stderr, r.stderr)
    r = loom("calibrate", "--level", "tcp", "--launcher", launcher, "--base",
             cluster("two-hosts.toml"), "--out", out, "--quick")
    check("ranks that do not cross the level: exit 1 saying so",
          r.returncode == 1 and 'lie within level "shm"' in r.stderr, r.stderr[-2000:])
    # 4 ranks across two-hosts' shm groups of 2: the level's collectives kept as measured, over
    # all 4 and over the pairs across (ranks 0 and 2, 1 and 3), and plan reads them back
    r = loom("calibrate", "--level", "tcp", "--launcher", launcher.replace("-np 2", "-np 4"),
             "--base", cluster("two-hosts.toml"), "--out", out, "--quick")
    ok = r.returncode == 0 and os.path.exists(out)
    check("calibrate --level tcp over 4 ranks: exit 0", ok, r.stderr[-2000:])
    if ok:
        tcp = tomllib.load(open(out, "rb"))["level"][-1]
        kinds = tcp.get("comm", {})
        ranks = {k: sorted({row[0] for row in v}) for k, v in kinds.items()}
        check("the level keeps each kind measured on 4 ranks and on the pairs across",
              set(ranks) == {"all_gather", "reduce_scatter", "all_reduce", "all_to_all"}
              and all(v == [2, 4] for v in ranks.values()), str(ranks))
        check("without --shared-by the replaced level's shared link stays shared",
              tcp.get("shared_by") == 2, str(tcp.get("shared_by")))
        r = loom("plan", cfg("tiny-llama.toml"), "--cluster", out, "--json", "--devices", "4",
                 "--set", "plan.mesh={data=4}", "--set", 'plan.tactics=[{kind="data",axis="data"}]')
        check("plan reads the measured collectives back", r.returncode == 0 and json_lines(r),
              r.stderr[-1000:])

# loom plan --search (src/loom/search/): the top plans and a pasteable [plan]; --json's summary;
# bad input: a budget or evaluation count that is not positive, no plan that fits (the closest
# named with its memory), a device count no plan can split the model over
tiny = cfg("tiny-llama.toml")
r = loom("plan", tiny, "--cluster", cluster("h100-sxm.toml"), "--devices", "4", "--search",
         "--exhaustive", "--set", "train.seq_len=32")
check("--search --exhaustive: exit 0, a table and a [plan] section to paste",
      r.returncode == 0 and "the whole space" in r.stdout and "[plan]" in r.stdout
      and "tactics = [" in r.stdout, r.stderr + r.stdout[-2000:])
r = loom("plan", tiny, "--cluster", cluster("h100-sxm.toml"), "--devices", "4", "--search",
         "--evals", "5", "--json", "--set", "train.seq_len=32")
rows = json_lines(r) if r.returncode == 0 else []
check("--search --evals 5 --json: top rows with the plan's figures, then the summary",
      len(rows) >= 2 and all("toml" in x and "step_ms" in x for x in rows[:-1])
      and rows[-1].get("evaluations") == 5 and rows[-1].get("plans_in_space", 0) > 5,
      r.stderr + r.stdout[-2000:])
# several evaluations at once: the limit kept, and the jobs named in the summary
r = loom("plan", tiny, "--cluster", cluster("h100-sxm.toml"), "--devices", "4", "--search",
         "--evals", "9", "--jobs", "3", "--json", "--set", "train.seq_len=32")
rows = json_lines(r) if r.returncode == 0 else []
check("--search --evals 9 --jobs 3: exit 0, 9 evaluations on 3 jobs",
      len(rows) >= 2 and rows[-1].get("evaluations") == 9 and rows[-1].get("jobs") == 3,
      r.stderr + r.stdout[-2000:])
for flag, value in [("--budget", "0"), ("--budget", "-3"), ("--evals", "0"), ("--jobs", "0")]:
    r = loom("plan", tiny, "--devices", "2", "--search", flag, value)
    check(f"--search {flag} {value}: exit non-zero naming the flag",
          r.returncode != 0 and flag in r.stderr, r.stderr)
with tempfile.TemporaryDirectory() as tmp:
    small = os.path.join(tmp, "small.toml")
    with open(cluster("h100-sxm.toml")) as f:
        text = f.read().replace("memory_bytes = 80e9", "memory_bytes = 1e5")
    with open(small, "w") as f:
        f.write(text)
    r = loom("plan", tiny, "--cluster", small, "--devices", "2", "--search", "--exhaustive")
    check("--search where nothing fits: exit 1, 'no plan fits' naming the closest and its peak",
          r.returncode == 1 and "no plan fits" in r.stderr and "the closest" in r.stderr
          and "at its peak" in r.stderr, r.stderr)
r = loom("plan", tiny, "--cluster", cluster("h100-sxm.toml"), "--devices", "3", "--search",
         "--set", "train.batch_size=4")
check("--search on 3 devices the model cannot be split over: exit 1, no crash",
      r.returncode == 1 and "no plan fits 3 devices" in r.stderr, r.stderr)

# 256 devices (8 a node): a reduction over more than 64 ranks, whose synthesized programs the
# symbolic run checks on their factors at size 2 (sim/p2.cc); it aborted the search before
r = loom("plan", tiny, "--cluster", cluster("h100-sxm.toml"), "--devices", "256", "--search",
         "--evals", "20", "--json", "--set", "train.batch_size=256", "--set", "train.seq_len=32")
rows = json_lines(r) if r.returncode == 0 else []
check("--search on 256 devices: exit 0, 20 evaluations, no abort",
      len(rows) >= 2 and rows[-1].get("evaluations") == 20, r.stderr[-2000:])

checks.finish()
