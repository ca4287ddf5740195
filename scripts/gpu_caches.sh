#!/usr/bin/env bash
# The cache systems on a GPU, in one go: the kernels against their references (Triton store
# bitwise, paged decode within bf16 tolerance), every cache type on CUDA against the CPU, a snapshot
# restored under a captured graph, the paged-kernel micro-benchmark, and decode tokens/s of each
# cache type on the Llama-3.2-1B shape at 128 and 4096 positions of context, side by side.
#
#   scripts/gpu_caches.sh OUTDIR        # from anywhere, on a CUDA machine; about 5 minutes on an H100
#
# Needs torch (CUDA), Triton, pytest, matplotlib; no network. OUTDIR receives log.txt, tests.xml,
# bench_kernels.json, decode_ctx128.json, decode_ctx4096.json, decode_ctx4096.png.
set -u
OUT="${1:?usage: scripts/gpu_caches.sh OUTDIR}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
LOG="$OUT/log.txt"
: >"$LOG"
say() { echo "[gpu_caches $(date +%H:%M:%S)] $*" | tee -a "$LOG"; }
status=0

say "environment"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || true
  $PY -c 'import torch, transformers, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__, "gpu", torch.cuda.get_device_name(0))'
  git rev-parse --short HEAD 2>/dev/null || true; } 2>&1 | tee -a "$LOG"

say "tests: kernels vs references, cache types on CUDA, snapshot under a captured graph"
timeout 600 $PY -m pytest -m gpu tests/unit/test_kernels_gpu.py tests/unit/test_caches_gpu.py -q -p no:cacheprovider \
    --junitxml "$OUT/tests.xml" 2>&1 | tee -a "$LOG"
[ "${PIPESTATUS[0]}" = 0 ] || status=1

say "benchmark: paged decode kernel vs gather + SDPA"
timeout 300 $PY benchmarks/bench_kernels.py --out "$OUT/bench_kernels.json" 2>&1 | tee -a "$LOG" || status=1

for ctx in 128 4096; do
    say "decode tokens/s per cache type, Llama-3.2-1B shape, context $ctx"
    plot=()
    [ "$ctx" = 4096 ] && plot=(--plot "$OUT/decode_ctx$ctx.png")
    timeout 400 $PY benchmarks/bench_generation.py --model llama-3.2-1b --device cuda --prompt-len "$ctx" \
        --new-tokens 64 --warmup 1 --repeats 2 --cache contiguous static dynamic paged --block-size 16 \
        --json "$OUT/decode_ctx$ctx.json" "${plot[@]}" 2>&1 | tee -a "$LOG"
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
done
say "done in ${SECONDS}s (exit $status)"
exit "$status"
