#!/usr/bin/env bash
# The package's dependencies and test extras at the lowest versions pyproject declares, in a venv of
# their own (scripts/lowest_versions.py writes the pins; pip resolves what they leave open). The
# package itself goes in after, with --no-deps: an editable build here would race with one of the
# same tree running beside it in .ci/run.
#
#   scripts/install_lowest.sh [VENV_DIR]      # default .venv-lowest; PYTHON picks the base interpreter
#   VENV_DIR/bin/python -m pip install --no-deps -e . && CI=true VENV_DIR/bin/python -m pytest -n auto
#
# PyPI's torch for Linux is a CUDA build: several GB installed with its nvidia-* wheels (with
# PIP_NO_CACHE_DIR=1, as .ci/run sets it, pip keeps no second copy of them in its cache).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv-lowest}
BASE_PYTHON=${PYTHON:-python3}
start=$SECONDS
"$BASE_PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$BASE_PYTHON" scripts/lowest_versions.py >"$VENV/lowest-requirements.txt"
echo "lowest declared versions: $(tr '\n' ' ' <"$VENV/lowest-requirements.txt")"
"$VENV/bin/python" -m pip install --quiet -r "$VENV/lowest-requirements.txt"
"$VENV/bin/python" -m pip list 2>/dev/null | grep -iE '^(torch|transformers|safetensors|tokenizers|numpy|xxhash|hypothesis|pytest|pytest-xdist|pytest-benchmark) ' || true
echo "installed in $((SECONDS - start)) s"
