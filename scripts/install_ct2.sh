#!/usr/bin/env bash
# CTranslate2 in a venv of its own, for the engine tier, with what its own checkpoint converter
# (ct2-transformers-converter) needs: transformers and torch. Never in the project's environment.
# Idempotent: a venv that already holds everything is left as it is.
#
#   scripts/install_ct2.sh [VENV_DIR]         # default .venv-ct2; PYTHON picks the base interpreter
#   export INFER_REF_CT2_PYTHON=VENV_DIR/bin/python
#
# torch is the CPU build (torch 2.13.0+cpu from the configured wheel source), installed first so
# that nothing later pulls a CUDA one; the converter loads the checkpoint through transformers.
set -euo pipefail
VENV=${1:-.venv-ct2}
BASE_PYTHON=${PYTHON:-python3}
CTRANSLATE2=4.8.5
TORCH=2.13.0
TRANSFORMERS=5.24.0
start=$SECONDS

step() {  # step NAME COMMAND...: runs COMMAND, prints how long it took
    local name=$1 t0=$SECONDS
    shift
    "$@"
    echo "install_ct2.sh: $name took $((SECONDS - t0)) s"
}

installed() {
    [ -x "$VENV/bin/python" ] && [ -x "$VENV/bin/ct2-transformers-converter" ] \
        && "$VENV/bin/python" - "$CTRANSLATE2" "$TORCH" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version

ctranslate2, torch = sys.argv[1:]
assert version("ctranslate2") == ctranslate2
assert version("torch").split("+")[0] == torch and "+cpu" in version("torch")
import ctranslate2, transformers  # noqa: F401,E401
PY
}

if installed; then
    echo "ctranslate2 $CTRANSLATE2 already in $VENV ($((SECONDS - start)) s):" \
        "export INFER_REF_CT2_PYTHON=$VENV/bin/python"
    exit 0
fi
"$BASE_PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --quiet)
step "torch $TORCH (CPU)" "${PIP[@]}" install "torch==$TORCH"
"$VENV/bin/python" -c "import torch, sys; sys.exit('+cpu' not in torch.__version__)" \
    || { echo "install_ct2.sh: torch in $VENV is not the CPU build" >&2; exit 1; }
step "ctranslate2 $CTRANSLATE2 and the converter's transformers" "${PIP[@]}" install \
    "ctranslate2==$CTRANSLATE2" "transformers==$TRANSFORMERS" safetensors sentencepiece
installed || { echo "install_ct2.sh: $VENV does not import ctranslate2 and transformers after installing (run $VENV/bin/python -c 'import ctranslate2, transformers' to see why)" >&2; exit 1; }
echo "ctranslate2 $CTRANSLATE2 installed in $VENV in $((SECONDS - start)) s:" \
    "export INFER_REF_CT2_PYTHON=$VENV/bin/python"
