#!/usr/bin/env bash
# OpenVINO GenAI with optimum-intel's exporter in a venv of its own, for the engine tier. Never in
# the project's environment. Idempotent: a venv that already holds everything is left as it is.
#
#   scripts/install_openvino.sh [VENV_DIR]    # default .venv-openvino; PYTHON picks the base interpreter
#   export INFER_REF_OPENVINO_PYTHON=VENV_DIR/bin/python
#
# Traps on the way, each handled here:
# - torch is the CPU build (2.13.0+cpu from the configured wheel source), installed first and pinned
#   by a constraint: optimum-intel's requirements otherwise let pip swap in a CUDA torch (GBs).
# - optimum-intel pulls torchvision, whose wheel does not load beside the CPU torch ("operator
#   torchvision::nms does not exist", raised when transformers imports it); text models need none
#   of it, so it is pinned to the release of this torch (no backtracking over releases) and uninstalled.
# - optimum-intel 2.2 caps transformers below 5.6 (5.5.4 here), and its Gemma 3 export refuses any
#   transformers above 5.0 ("Maximum required is 5.0"): transformers 5.0.0 goes to
#   VENV/src/export-transformers (pip --target, no dependencies: the venv's serve it), which the
#   adapter puts first on the exporter's PYTHONPATH where the exporter refuses the venv's own.
set -euo pipefail
VENV=${1:-.venv-openvino}
BASE_PYTHON=${PYTHON:-python3}
TORCH=2.13.0
TORCHVISION=0.28.0
OPENVINO=2026.4.1
OPENVINO_GENAI=2026.4.1.0
OPTIMUM_INTEL=2.2.0
EXPORT_TRANSFORMERS=5.0.0
EXPORT_PATH="$VENV/src/export-transformers"
start=$SECONDS

step() {  # step NAME COMMAND...: runs COMMAND, prints how long it took
    local name=$1 t0=$SECONDS
    shift
    "$@"
    echo "install_openvino.sh: $name took $((SECONDS - t0)) s"
}

installed() {
    [ -x "$VENV/bin/python" ] && [ -x "$VENV/bin/optimum-cli" ] && [ -d "$EXPORT_PATH/transformers" ] \
        && "$VENV/bin/python" - "$OPENVINO_GENAI" "$OPTIMUM_INTEL" "$TORCH" <<'PY' 2>/dev/null
import sys
from importlib.metadata import PackageNotFoundError, version

genai, optimum_intel, torch = sys.argv[1:]
assert version("openvino-genai") == genai and version("optimum-intel") == optimum_intel
assert version("torch").split("+")[0] == torch and "+cpu" in version("torch")
try:
    version("torchvision")
    sys.exit(1)
except PackageNotFoundError:
    pass
import openvino_genai, openvino_tokenizers, optimum.intel, transformers  # noqa: F401,E401
PY
}

if installed; then
    echo "OpenVINO GenAI $OPENVINO_GENAI already in $VENV ($((SECONDS - start)) s): export INFER_REF_OPENVINO_PYTHON=$VENV/bin/python"
    exit 0
fi
"$BASE_PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --quiet)
CONSTRAINTS="$VENV/constraints.txt"
printf 'torch==%s+cpu\ntorchvision==%s\n' "$TORCH" "$TORCHVISION" > "$CONSTRAINTS"
step "torch $TORCH (CPU)" "${PIP[@]}" install -c "$CONSTRAINTS" "torch==$TORCH"
step "openvino, openvino-genai, openvino-tokenizers, optimum-intel" "${PIP[@]}" install -c "$CONSTRAINTS" \
    "openvino==$OPENVINO" "openvino-genai==$OPENVINO_GENAI" "openvino-tokenizers==$OPENVINO_GENAI" \
    "optimum-intel[openvino]==$OPTIMUM_INTEL"
"${PIP[@]}" uninstall --yes torchvision 2>/dev/null || true
step "transformers $EXPORT_TRANSFORMERS for the Gemma 3 export" "${PIP[@]}" install --no-deps \
    --target "$EXPORT_PATH" "transformers==$EXPORT_TRANSFORMERS"
installed || { echo "install_openvino.sh: $VENV does not import openvino_genai, openvino_tokenizers, optimum.intel and transformers after installing (run $VENV/bin/python -c 'import openvino_genai, optimum.intel' to see why)" >&2; exit 1; }
echo "OpenVINO GenAI $OPENVINO_GENAI installed in $VENV in $((SECONDS - start)) s ($(du -sh "$VENV" | cut -f1)):" \
    "export INFER_REF_OPENVINO_PYTHON=$VENV/bin/python"
