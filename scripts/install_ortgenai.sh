#!/usr/bin/env bash
# ONNX Runtime GenAI in a venv of its own, for the engine tier, with what its model builder needs
# (python -m onnxruntime_genai.models.builder, which the tier runs on every checkpoint folder).
# Never in the project's environment. Idempotent: a venv that already holds everything is left as it is.
#
#   scripts/install_ortgenai.sh [VENV_DIR]    # default .venv-ortgenai; PYTHON picks the base interpreter
#   export INFER_REF_ORTGENAI_PYTHON=VENV_DIR/bin/python
#
# torch is the CPU build (torch 2.13.0+cpu from the configured wheel source), installed first so
# that nothing later pulls a CUDA one; the builder imports torch and transformers to read a folder,
# and onnx and onnx-ir to write the model (onnx-ir is not among onnxruntime-genai's requirements).
set -euo pipefail
VENV=${1:-.venv-ortgenai}
BASE_PYTHON=${PYTHON:-python3}
ORTGENAI=${ORTGENAI_VERSION:-0.18.0}
TORCH=2.13.0
start=$SECONDS

step() {  # step NAME COMMAND...: runs COMMAND, prints how long it took
    local name=$1 t0=$SECONDS
    shift
    "$@"
    echo "install_ortgenai.sh: $name took $((SECONDS - t0)) s"
}

installed() {
    [ -x "$VENV/bin/python" ] && "$VENV/bin/python" - "$ORTGENAI" "$TORCH" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version

ortgenai, torch = sys.argv[1:]
assert version("onnxruntime-genai") == ortgenai
assert version("torch").split("+")[0] == torch and "+cpu" in version("torch")
import onnx, onnx_ir, onnxruntime, onnxruntime_genai, onnxruntime_genai.models.builder, transformers  # noqa: F401,E401
PY
}

if installed; then
    echo "onnxruntime-genai $ORTGENAI already in $VENV ($((SECONDS - start)) s): export INFER_REF_ORTGENAI_PYTHON=$VENV/bin/python"
    exit 0
fi
"$BASE_PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --quiet)
step "torch $TORCH (CPU)" "${PIP[@]}" install "torch==$TORCH"
"$VENV/bin/python" -c "import torch, sys; sys.exit('+cpu' not in torch.__version__)" \
    || { echo "install_ortgenai.sh: torch in $VENV is not the CPU build" >&2; exit 1; }
step "onnxruntime-genai $ORTGENAI and the builder's requirements" "${PIP[@]}" install \
    "onnxruntime-genai==$ORTGENAI" onnxruntime onnx onnx-ir transformers
installed || { echo "install_ortgenai.sh: $VENV does not import onnxruntime_genai and its model builder after installing (run $VENV/bin/python -m onnxruntime_genai.models.builder --help to see why)" >&2; exit 1; }
echo "onnxruntime-genai $ORTGENAI installed in $VENV in $((SECONDS - start)) s: export INFER_REF_ORTGENAI_PYTHON=$VENV/bin/python"
