#!/usr/bin/env bash
# Triton kernels on a CUDA machine: the GPU tests against the references, then the paged decode
# micro-benchmark (kernel vs gather + SDPA, Llama-3.2-1B attention shape, bf16).
#
#   OUT=/some/dir scripts/gpu_kernels.sh     # from the repository root; about 2 minutes on an H100
#
# Needs torch (CUDA), Triton, pytest; no network. Writes into $OUT: log.txt, tests.xml (JUnit),
# bench_kernels.json. Exits non-zero when a test fails.
set -u
OUT=${OUT:?set OUT to the results folder}
mkdir -p "$OUT"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
LOG="$OUT/log.txt"
: >"$LOG"
say() { echo "[gpu_kernels $(date +%H:%M:%S)] $*" | tee -a "$LOG"; }

say "environment"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || true
  $PY -c 'import torch, sys; import triton; print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__, "gpu", torch.cuda.get_device_name(0))'
  git rev-parse --short HEAD 2>/dev/null || true; } 2>&1 | tee -a "$LOG"

say "tests: pytest -m gpu tests/unit/test_kernels_gpu.py"
timeout 900 $PY -m pytest -m gpu tests/unit/test_kernels_gpu.py -q -p no:cacheprovider --junitxml "$OUT/tests.xml" 2>&1 | tee -a "$LOG"
TESTS_RC=${PIPESTATUS[0]}
say "tests: rc=$TESTS_RC"

say "benchmark: benchmarks/bench_kernels.py"
timeout 600 $PY benchmarks/bench_kernels.py --out "$OUT/bench_kernels.json" 2>&1 | tee -a "$LOG"
say "benchmark: rc=${PIPESTATUS[0]}"
say "done in ${SECONDS}s"
exit "$TESTS_RC"
