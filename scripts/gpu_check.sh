#!/usr/bin/env bash
# The GPU check, run on a GPU machine in one go (the device tool: carry [".gpu"], command
# `bash scripts/gpu_check.sh`), with the binaries scripts/gpu_bundle.sh packed here. It prints the
# GPU and library versions, runs the CUDA backend's parity tests (tests/gpu_parity_test: every op
# harness graph, kernels on odd and large shapes, whole steps of the tiny models against the CPU
# engine, a GPU run repeated bit for bit), the golden tests on the GPU, `loom bench`, `loom train`
# and `loom sample` on both devices (tests/gpu_train_check.py), and writes logs and JSON
# under $OUT (or ./gpu-out): logs.tar.gz holds every log. Exit status: non-zero when a check failed.
# LOOM_GPU_CHECK (default "parity speed large calibrate golden train") picks the parts run, so that a rerun
# after a fix can spend the lease's minutes on what changed; LOOM_GPU_PEERS (default "eager
# compile") the PyTorch peers of the large models.
set -uo pipefail
parts=" ${LOOM_GPU_CHECK:-parity speed large calibrate golden train} "
want() { [[ $parts == *" $1 "* ]]; }
cd "$(dirname "$0")/.."
# everything is written under $out and packed into $final at the end: the device tool returns at
# most 8 files (logs.tar.gz, and the JSON a figure is read from)
final=${OUT:-$PWD/gpu-out}
out=/tmp/loom-gpu-out
rm -rf "$out" && mkdir -p "$out" "$final"
root=/tmp/loom-gpu
rm -rf "$root" && mkdir -p "$root" && tar -C "$root" -xJf .gpu/bundle.tar.xz || exit 1
export LD_LIBRARY_PATH="$root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
# cuBLASLt and cuDNN (with the NVRTC and libcudart.so its engines and frontend load) come from the
# GPU machine's own installation (PyTorch's nvidia-* packages)
nvroot=$(python3 -c 'import nvidia; print(list(nvidia.__path__)[0])' 2>/dev/null || true)
for d in "$nvroot/cu13/lib" "$nvroot/cudnn/lib"; do
  [[ -n $nvroot && -d $d ]] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"
done
# the binaries read configs under the source tree they were built in
src=/work/main
if [[ ! -e $src/configs ]]; then mkdir -p "$(dirname "$src")" && ln -sfn "$PWD" "$src"; fi
status=0
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1
  ls /usr/local/nvidia/lib64 2>/dev/null | head -5
  python3 -m pip list 2>/dev/null | grep -iE '^nvidia-(cudnn|cublas|cuda-nvrtc|cuda-runtime)'
} | tee "$out/env.txt"
if want parity; then
  timeout 420 "$root/bin/gpu_parity_test" --gtest_output=json:"$out/gpu_parity.json" \
    >"$out/gpu_parity.log" 2>&1 || status=1
  grep -E '^\[  (FAILED|PASSED) |tests? ran|^\[  FAILED  \]' "$out/gpu_parity.log" | tail -40
  grep -B2 -A8 'Failure' "$out/gpu_parity.log" | head -120
fi
# loom bench and loom train through the front door, on both devices (the same config and data)
want speed && for dev in cpu cuda; do
  timeout 300 "$root/bin/loom" bench configs/tiny-llama.toml --steps 20 --warmup 3 \
    --set train.device=$dev >"$out/bench-tiny-$dev.json" 2>"$out/bench-tiny-$dev.log" ||
    { status=1; tail -5 "$out/bench-tiny-$dev.log"; }
  echo "bench tiny-llama $dev: $(head -c 600 "$out/bench-tiny-$dev.json")"
done
# speed, same model, batch and dtype: Loom (cuBLASLt, and its tiled GEMM) beside eager PyTorch
# (bench/gpu/torch_step.py: bf16 compute, f32 masters, fused AdamW, no recomputation)
# (variants: cuBLASLt with CUDA graphs, without them, and the tiled GEMM)
want speed && for v in graphs nographs tiled; do
  env=(LOOM_CUDA_GRAPHS=1 LOOM_CUDA_GEMM=cublaslt)
  [[ $v == nographs ]] && env=(LOOM_CUDA_GRAPHS=0 LOOM_CUDA_GEMM=cublaslt)
  [[ $v == tiled ]] && env=(LOOM_CUDA_GRAPHS=1 LOOM_CUDA_GEMM=tiled)
  env "${env[@]}" timeout 300 "$root/bin/loom" bench configs/bench-llama.toml --steps 30 \
    --warmup 5 --set train.device=cuda --set model.dtype=bf16 >"$out/speed-loom-$v.json" \
    2>"$out/speed-loom-$v.log" || { status=1; tail -5 "$out/speed-loom-$v.log"; }
  python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print("loom", sys.argv[2], "step_ms", j["step_ms"], "tokens/s", j.get("tokens_per_s"), "device_peak_bytes", j.get("device_peak_bytes"))' \
    "$out/speed-loom-$v.json" $v 2>&1
done
want speed && for mode in eager compile; do
  flag=()
  [[ $mode == compile ]] && flag=(--compile)
  timeout 240 python3 bench/gpu/torch_step.py configs/bench-llama.toml --ac none --steps 30 \
    --warmup 5 "${flag[@]}" --out "$out/speed-torch-$mode.json" >"$out/speed-torch-$mode.log" 2>&1 ||
    tail -5 "$out/speed-torch-$mode.log"
  python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print("torch", j["mode"], "step_ms", j["step_ms"], "tokens/s", j["tokens_per_s"], "peak_allocated", j.get("peak_allocated"))' \
    "$out/speed-torch-$mode.json" 2>&1
done
# the issue's comparison: Llama 3.2 1B's shape (sequence 2048) and GPT-2 124M (llm.c's, sequence
# 1024), each config's batch, Loom (cuBLASLt, flash attention, CUDA graphs) beside PyTorch eager and
# torch.compile; tokens/s, MFU and peak memory side by side (bench/gpu/mfu.py)
# Loom's variants (LOOM_GPU_VARIANTS, default all three): attention on cuDNN (the default), on its own
# tensor-core kernels (flash), and the forward's bf16 weights kept for the backward (keepcast:
# [passes] recast = false)
want large && for m in llama3.2-1b gpt2-124m; do
  runs=()
  for v in ${LOOM_GPU_VARIANTS-loom flash keepcast}; do
    env=() sets=()
    [[ $v == flash ]] && env=(LOOM_CUDA_ATTENTION=flash)
    [[ $v == keepcast ]] && sets=(--set passes.recast=false)
    env "${env[@]}" timeout 200 "$root/bin/loom" bench configs/$m.toml --steps 10 --warmup 3 \
      --set train.device=cuda "${sets[@]}" >"$out/speed-$v-$m.json" 2>"$out/speed-$v-$m.log" ||
      { status=1; tail -5 "$out/speed-$v-$m.log"; }
    runs+=("$v=$out/speed-$v-$m.json")
  done
  for mode in ${LOOM_GPU_PEERS-eager compile}; do
    flag=()
    [[ $mode == compile ]] && flag=(--compile)
    timeout 240 python3 bench/gpu/torch_step.py configs/$m.toml --ac none --steps 10 --warmup 3 \
      "${flag[@]}" --out "$out/speed-torch-$m-$mode.json" >"$out/speed-torch-$m-$mode.log" 2>&1 ||
      tail -5 "$out/speed-torch-$m-$mode.log"
  done
  python3 bench/gpu/mfu.py configs/$m.toml "${runs[@]}" \
    torch-eager="$out/speed-torch-$m-eager.json" torch-compile="$out/speed-torch-$m-compile.json" |
    tee "$out/speed-$m.md"
  # where Loom's step goes: time per op, each node stamped on the stream (no graph)
  timeout 120 "$root/bin/loom" bench configs/$m.toml --steps 2 --warmup 1 --profile \
    --set train.device=cuda >/dev/null 2>"$out/profile-$m.txt" || tail -3 "$out/profile-$m.txt"
  python3 bench/gpu/profile_top.py "$out/profile-$m.txt"
done
# loom calibrate from Loom's own kernels on this GPU: each large model's step with every kernel
# stamped on the stream (loom bench --kernels-out), both files made one cluster file's profile on
# clusters/h200.toml, and loom plan's prediction of each model's step and memory from it beside
# the measured (the graph step of `large` above, and this run's stamped step)
if want calibrate; then
  timed=()
  for m in llama3.2-1b gpt2-124m; do
    timeout 200 "$root/bin/loom" bench configs/$m.toml --steps 5 --warmup 2 \
      --set train.device=cuda --kernels-out "$out/kernels-$m.json" >"$out/stamped-$m.json" \
      2>"$out/stamped-$m.log" || { status=1; tail -5 "$out/stamped-$m.log"; }
    timed+=(--import "$out/kernels-$m.json")
  done
  "$root/bin/loom" calibrate "${timed[@]}" --base clusters/h200.toml \
    --out "$out/h200-loom.toml" 2>&1 | tail -2 || status=1
  for m in llama3.2-1b gpt2-124m; do
    "$root/bin/loom" plan configs/$m.toml --cluster "$out/h200-loom.toml" --devices 1 --json \
      >"$out/plan-$m.json" 2>"$out/plan-$m.log" || { status=1; tail -3 "$out/plan-$m.log"; }
    python3 - "$out" "$m" <<'PY'
import json, sys
out, m = sys.argv[1:]
def load(p):
    try:
        with open(p) as f:
            return json.loads(f.read().splitlines()[0])
    except (OSError, ValueError, IndexError):
        return {}
plan, stamped, graph = (load(f"{out}/{p}") for p in (f"plan-{m}.json", f"stamped-{m}.json",
                                                          f"speed-loom-{m}.json"))
med = lambda j: j.get("step_ms", {}).get("median") if isinstance(j.get("step_ms"), dict) else None
print(f"calibrate {m}: predicted {plan.get('step_ms')} ms, {plan.get('peak_bytes')} B; measured "
      f"graph {med(graph)} ms, stamped {med(stamped)} ms, device peak {graph.get('device_peak_bytes')} B, "
      f"used {graph.get('device_used_bytes')} B")
PY
  done
fi
# the golden tests with device = cuda: PyTorch's loss, logits, gradients and 10-step curve
want golden && for g in tiny-llama tiny-llama-tied tiny-gpt2 tiny-moe; do
  for dt in f32 bf16; do
    if "$root/bin/golden_test" configs/$g.toml "$root/golden/$g-$dt" $dt --set train.device=cuda \
      >"$out/golden-$g-$dt.log" 2>&1; then
      echo "ok   golden $g $dt on cuda"
    else
      status=1
      echo "FAIL golden $g $dt on cuda"
      tail -8 "$out/golden-$g-$dt.log"
    fi
  done
done
# loom train on the GPU: the quickstart model against the CPU, kill and resume, GPU -> CPU resume
if want train; then
  timeout 420 python3 tests/gpu_train_check.py "$root/bin/loom" "$PWD" 2>&1 | tee "$out/gpu_train.log"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
fi
tar -C "$out" -czf "$final/logs.tar.gz" .
cp "$out"/gpu_parity.json "$out"/speed-*.md "$out"/h200-loom.toml "$final/" 2>/dev/null  # the rest: logs.tar.gz
exit $status
