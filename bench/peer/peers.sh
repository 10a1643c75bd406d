# Sourced by bench/lm_bench.sh and bench/plan_bench.sh: how the peers run.
#   peer         the prefix of every peer's command: this machine's environment may set
#                OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE, which slow OpenBLAS; they are unset for
#                the peers only, never for Loom or the tests
#   venv_python  PyTorch 2.x's interpreter when bench/peer/setup_venv.sh has made the venv
#                ($LOOM_PEER_VENV), else empty (then only Debian's PyTorch 1.13 runs)
peer=(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE)
venv_python=${LOOM_PEER_VENV:-$HOME/.cache/loom/peer-venv}/bin/python
if [[ ! -x $venv_python ]]; then
  echo "$(basename "$0"): no PyTorch 2.x peer ($venv_python missing; bench/peer/setup_venv.sh" \
    "makes it)" >&2
  venv_python=
fi
