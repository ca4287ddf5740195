#!/usr/bin/env bash
# The GPU runner's CI: on one GPU machine, in at most 10 minutes (the install included), the README's
# test command with the GPU visible, `pytest -m gpu`, the engine tier on CUDA (infer_ref's Engine,
# bfloat16), the CUDA golden files verified on CUDA, and the benchmark gate saved and compared.
# scripts/gpu_ci.py runs the stages and says what goes into $OUT; this script installs the package first.
#
#     OUT=dir scripts/gpu_ci.sh                        # on a GPU machine; exit status 0 only if every stage passed
#     OUT=dir GPU_CI_STANDIN=1 scripts/gpu_ci.sh       # a rehearsal on any machine: stand-in stages, no install
#     python scripts/gpu_ci.py record dir              # then: the result into the tree and CONTRIBUTING.md
# Environment: PYTHON (default python3), GPU_CI_BUDGET (seconds for the whole script, default 570: the
# GPU host stops a command at 600), GPU_CI_TREE (the commit, for a copy of the tree without .git), GPU_CI_SEED
# (the Hypothesis seed of pytest -m gpu, default 0), GPU_CI_FAIL (with GPU_CI_STANDIN=1: the stage whose stand-in fails).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:?set OUT to the results folder}
PY=${PYTHON:-python3}
BUDGET=${GPU_CI_BUDGET:-570}
START=$SECONDS
# Bytecode written once and reused by every pytest process and xdist worker (see .ci/run).
unset PYTHONDONTWRITEBYTECODE
export PIP_DISABLE_PIP_VERSION_CHECK=1
if [[ ${GPU_CI_STANDIN:-0} == 1 ]]; then
    exec "$PY" scripts/gpu_ci.py run "$OUT" --budget "$BUDGET" --standin ${GPU_CI_FAIL:+--fail "$GPU_CI_FAIL"}
fi
echo "=== stage: install the package into $("$PY" -c 'import sys; print(sys.executable)')"
if "$PY" -c "import torch, transformers, safetensors, tokenizers, xxhash, numpy, pytest, xdist, pytest_benchmark, hypothesis" 2>/dev/null; then
    # Every dependency is there already (a GPU host may reach no package registry): the package alone.
    "$PY" -m pip install --quiet --no-deps --no-build-isolation -e .
else
    "$PY" -m pip install --quiet -e '.[test]'
fi
echo "=== stage done in $((SECONDS - START)) s: install"
exec "$PY" scripts/gpu_ci.py run "$OUT" --budget "$((BUDGET - (SECONDS - START)))" --install-seconds "$((SECONDS - START))"
