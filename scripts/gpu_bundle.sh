#!/usr/bin/env bash
# Packs what scripts/gpu_check.sh runs on a GPU machine into .gpu/bundle.tar.xz: the cuda preset's
# binaries (loom, loom-text, gpu_parity_test, golden_test), PyTorch's golden files of the tiny models,
# and the shared libraries they load that a bare GPU
# image lacks (oneDNN, gRPC, MPI, ...; not the C library, libstdc++ or the driver, which it has).
# The GPU machine has CUDA's driver and runtime but none of Debian's -dev packages, so the binaries
# are built here (scripts/setup.sh --cuda) and carried: .gpu is ignored by git, and the device tool
# carries it (carry: [".gpu"]), 64 MiB at most.
set -euo pipefail
cd "$(dirname "$0")/.."
build=build/cuda
cmake --build --preset cuda -j "$(nproc)" --target loom loom-text gpu_parity_test golden_test
rm -rf .gpu/stage && mkdir -p .gpu/stage/bin .gpu/stage/lib
bins=("$build/tools/loom/loom" "$build/tools/loom/loom-text" "$build/tests/gpu_parity_test"
      "$build/tests/golden_test")
cp "${bins[@]}" .gpu/stage/bin/
skip='^(linux-vdso|libc\.so|libm\.so|libstdc\+\+|libgcc_s|ld-linux|libpthread|libdl\.so|librt\.so|libcuda\.so)'
for b in "${bins[@]}"; do
  ldd "$b" | awk '$3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r name path; do
  [[ $name =~ $skip ]] || cp -L "$path" .gpu/stage/lib/
done
# PyTorch's golden files for the models the GPU check compares (build/release's golden fixtures:
# ctest --test-dir build/release -L golden writes them)
for g in tiny-llama tiny-llama-tied tiny-gpt2 tiny-moe; do
  for dt in f32 bf16; do
    src=build/release/golden/$g-$dt
    [[ -f $src/expected.safetensors ]] || { echo "gpu_bundle: $src missing (run the golden tests)" >&2; exit 1; }
    mkdir -p .gpu/stage/golden/$g-$dt
    cp "$src"/weights.safetensors "$src"/tokens.safetensors "$src"/expected.safetensors \
      .gpu/stage/golden/$g-$dt/
  done
done
tar -C .gpu/stage -cJf .gpu/bundle.tar.xz .
rm -rf .gpu/stage
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >>.git/info/exclude
ls -la .gpu/bundle.tar.xz
