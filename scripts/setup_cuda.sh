#!/usr/bin/env bash
# Installs the CUDA 13.0 compiler the cuda preset builds with: NVIDIA's PyPI wheels (nvcc, NVVM, the
# CUDA runtime with its static library, CCCL), cuBLAS's, cuDNN's and NVRTC's headers alone and the
# header-only cudnn-frontend (the libraries are opened at run time from the GPU machine's
# installation), unpacked under /opt/loom-cuda, where the cuda preset (CMakePresets.json) finds
# them; no GPU or driver is needed to build. Pinned to 13.0.x: the GPU machines' driver is CUDA
# 13.0, and code from a newer compiler would not load there. Safe to run again.
set -euo pipefail
home=/opt/loom-cuda
cu=$home/nvidia/cu13
wheels=(nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88
        nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85)
cublas=nvidia-cublas==13.0.2.14
# cuDNN: its headers alone (the library is opened at run time, as cuBLASLt is) and the header-only
# cudnn-frontend its fused attention is built with
cudnn=nvidia-cudnn-cu13==9.13.0.50
frontend=nvidia-cudnn-frontend==1.32.0
nvrtc=nvidia-cuda-nvrtc==13.0.88  # nvrtc.h, which the frontend includes
if [[ -x $cu/bin/nvcc && -f $home/.complete-3 ]]; then exit 0; fi
SUDO=""
[[ $(id -u) -ne 0 && ! -w $(dirname "$home") ]] && SUDO=sudo
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "setup: downloading the CUDA 13.0 compiler wheels (~100 MB; cuBLAS's, cuDNN's and NVRTC's, ~1 GB, for their headers) into $home"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 \
  --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$tmp" "${wheels[@]}"
$SUDO mkdir -p "$home"
for w in "$tmp"/*.whl; do $SUDO python3 -m zipfile -e "$w" "$home"; done
# cuBLAS: only its headers (the wheel's 590 MB of libraries stay behind)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 \
  --platform manylinux_2_27_x86_64 -d "$tmp/cublas" "$cublas"
$SUDO python3 - "$tmp"/cublas/*.whl "$home" <<'PY'
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
for n in z.namelist():
    if n.startswith("nvidia/cu13/include/cublas"):
        z.extract(n, sys.argv[2])
PY
# cuDNN, its frontend and NVRTC: headers only (cuDNN's wheel is ~350 MB, NVRTC's 90 MB; their
# libraries stay behind)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 \
  --platform manylinux_2_27_x86_64 --platform manylinux_2_12_x86_64 -d "$tmp/cudnn" "$cudnn" \
  "$frontend" "$nvrtc"
$SUDO python3 - "$home" "$tmp"/cudnn/*.whl <<'PY'
import sys, zipfile
home = sys.argv[1]
for w in sys.argv[2:]:
    z = zipfile.ZipFile(w)
    for n in z.namelist():
        if n.startswith("nvidia/cudnn/include/") or n == "nvidia/cu13/include/nvrtc.h":
            z.extract(n, home)
        elif n.startswith("include/") and "cudnn_frontend" in w:
            z.extract(n, home + "/cudnn-frontend")
PY
# nvcc looks for libraries in lib64; CMake's FindCUDAToolkit wants libcudart.so beside the static one
$SUDO ln -sfn lib "$cu/lib64"
$SUDO ln -sf libcudart.so.13 "$cu/lib/libcudart.so"
$SUDO chmod +x "$cu"/bin/* "$cu"/nvvm/bin/*
"$cu/bin/nvcc" --version | tail -2
$SUDO touch "$home/.complete-3"
