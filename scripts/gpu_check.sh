#!/usr/bin/env bash
# The GPU check, run on a GPU machine in one go (the device tool: carry [".gpu"], command
# `bash scripts/gpu_check.sh`), with the binaries scripts/gpu_bundle.sh packed here. It prints the
# GPU and library versions, runs the CUDA backend's parity tests (tests/gpu_parity_test: every op
# harness graph, kernels on odd and large shapes, whole steps of the tiny models against the CPU
# engine, a GPU run repeated bit for bit), `loom bench` and `loom train` on both devices
# (tests/gpu_train_check.py), and writes logs and JSON
# under $OUT (or ./gpu-out). Exit status: non-zero when a check failed.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
root=/tmp/loom-gpu
rm -rf "$root" && mkdir -p "$root" && tar -C "$root" -xJf .gpu/bundle.tar.xz || exit 1
export LD_LIBRARY_PATH="$root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
# the binaries read configs under the source tree they were built in
src=/work/main
if [[ ! -e $src/configs ]]; then mkdir -p "$(dirname "$src")" && ln -sfn "$PWD" "$src"; fi
status=0
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1
  ls /usr/local/nvidia/lib64 2>/dev/null | head -5
} | tee "$out/env.txt"
timeout 420 "$root/bin/gpu_parity_test" --gtest_output=json:"$out/gpu_parity.json" \
  >"$out/gpu_parity.log" 2>&1 || status=1
grep -E '^\[  (FAILED|PASSED) |tests? ran|^\[  FAILED  \]' "$out/gpu_parity.log" | tail -40
grep -B2 -A8 'Failure' "$out/gpu_parity.log" | head -120
# loom bench and loom train through the front door, on both devices (the same config and data)
for dev in cpu cuda; do
  timeout 300 "$root/bin/loom" bench configs/tiny-llama.toml --steps 20 --warmup 3 \
    --set train.device=$dev >"$out/bench-tiny-$dev.json" 2>"$out/bench-tiny-$dev.log" ||
    { status=1; tail -5 "$out/bench-tiny-$dev.log"; }
  echo "bench tiny-llama $dev: $(head -c 600 "$out/bench-tiny-$dev.json")"
done
# loom train on the GPU: the quickstart model against the CPU, kill and resume, GPU -> CPU resume
timeout 420 python3 tests/gpu_train_check.py "$root/bin/loom" "$PWD" 2>&1 | tee "$out/gpu_train.log"
[[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
exit $status
