#!/usr/bin/env bash
# Sets up everything (scripts/setup.sh), checks the formatting (scripts/check_format.sh) and runs the
# default test suite: labels unit and golden, then the cuda preset's build and unit tests, then the
# fuzz targets for a bounded time (label fuzz, in the separate clang build build/fuzz).
# Longer suites: ctest --test-dir build/release -L slow
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/check_format.sh
# Tests run two at a time on 2 cores: OpenMP threads that spin while waiting would starve each
# other, so they sleep instead (no effect on results, only on wall time).
export OMP_WAIT_POLICY=passive
ctest --test-dir build/release -L 'unit|golden' --output-on-failure -j "$(nproc)"
# The CUDA build (the cuda preset: the CUDA backend beside the CPU one) compiles here with nvcc from
# PyPI's wheels; its tests that need no GPU run here, those that do (label gpu) on a GPU machine
# (scripts/gpu_check.sh).
scripts/setup_cuda.sh
cmake --preset cuda -DLOOM_WERROR="${LOOM_WERROR:-OFF}" >/dev/null
cmake --build --preset cuda -j "$(nproc)"
ctest --test-dir build/cuda -L unit --output-on-failure -j "$(nproc)"
# The fuzzers (fuzz/): every reader of untrusted bytes, built with clang's libFuzzer, ASan and
# UBSan, each fuzzed for LOOM_FUZZ_SECONDS (20) from its seeds; longer campaigns: fuzz/run.sh.
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz -j "$(nproc)"
ctest --test-dir build/fuzz -L fuzz --output-on-failure -j "$(nproc)"
