#!/usr/bin/env bash
# Installs every Debian package Loom's build, tests and golden checks need, then configures and builds
# the release preset. Safe to run again. LOOM_WERROR=ON (CI) builds with warnings as errors.
# --cuda: also installs the CUDA compiler (scripts/setup_cuda.sh) and builds the cuda preset (the
# CUDA backend beside the CPU one; running it needs an NVIDIA GPU, building it does not).
set -euo pipefail
cd "$(dirname "$0")/.."

# Open MPI: the mpi communicator and multi-process runs (mpirun). clang-format: scripts/check_format.sh.
# clang 14 with its libFuzzer runtime and OpenMP: the fuzz build (cmake --preset fuzz, fuzz/).
# gRPC + protobuf: the outer sync service (loom outer-server); openssl makes the TLS test's certificate.
# python3-pip: scripts/setup_cuda.sh downloads the CUDA compiler wheels (the cuda preset).
# libopenblas0-pthread: Debian's PyTorch takes its f32 GEMM from the system BLAS; without OpenBLAS it falls
# back to the netlib reference BLAS (~1 GFLOP/s), which would make the benchmark peer a straw man.
packages=(
  build-essential cmake ninja-build pkg-config zlib1g-dev
  libdnnl-dev libfmt-dev nlohmann-json3-dev libtomlplusplus-dev libcli11-dev
  libgtest-dev libgmock-dev libbenchmark-dev libsentencepiece-dev libpcre2-dev
  python3-torch python3-numpy libopenblas0-pthread python3-pip
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc openssl
  libopenmpi-dev openmpi-bin
  clang-format
  clang-14 libclang-rt-14-dev libomp-14-dev
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

cmake --preset release -DLOOM_WERROR="${LOOM_WERROR:-OFF}" >/dev/null
cmake --build --preset release -j "$(nproc)"
if [[ ${1:-} == --cuda ]]; then
  scripts/setup_cuda.sh
  cmake --preset cuda -DLOOM_WERROR="${LOOM_WERROR:-OFF}" >/dev/null
  cmake --build --preset cuda -j "$(nproc)"
fi
