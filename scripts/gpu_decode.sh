#!/usr/bin/env bash
# Decode speed at every context length on a CUDA machine: the GPU tests of the decode kernels and
# the fast path, then decode_compare's context sweep (three families, static and paged caches,
# compiled step, accuracy against a float32 reference, eager rounds against transformers).
#
#   OUT=/some/dir scripts/gpu_decode.sh                      # from the repository root
#   OUT=/some/dir STAGES="sweep" CONTEXTS="128 4096" scripts/gpu_decode.sh   # a part
#
# Needs torch (CUDA), Triton, transformers, pytest, matplotlib; no network. The sweep alone takes
# about 6 minutes on an H100 for two contexts (torch.compile of each decoder is most of it) and
# skips, and lists, what would run past BUDGET_S. Writes into $OUT: log.txt, tests.log,
# decode.json, decode.md, decode.png. Exits non-zero when a test fails.
set -u
OUT=${OUT:?set OUT to the results folder}
mkdir -p "$OUT"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
STAGES=${STAGES:-tests sweep}
CONTEXTS=${CONTEXTS:-128 1024 4096 16384}
BUDGET_S=${BUDGET_S:-1500}
LOG="$OUT/log.txt"
: >"$LOG"
say() { echo "[gpu_decode $(date +%H:%M:%S)] $*" | tee -a "$LOG"; }
want() { [[ " $STAGES " == *" $1 "* ]]; }
RC=0

if want tests; then
    say "tests: pytest -m gpu (decode kernels, decode step, caches on CUDA, fast path)"
    $PY -m pytest -m gpu -p no:cacheprovider -q tests/kernels tests/unit/test_kernels_gpu.py \
        tests/unit/test_caches_gpu.py tests/unit/test_fast_decode.py tests/benchmarks/test_decode_compare_gpu.py \
        >"$OUT/tests.log" 2>&1 || RC=1
    tail -3 "$OUT/tests.log" | tee -a "$LOG"
fi
if want sweep; then
    say "sweep: contexts $CONTEXTS"
    # shellcheck disable=SC2086  # CONTEXTS is a list
    $PY benchmarks/decode_compare.py --device cuda --contexts $CONTEXTS --caches static paged --compile \
        --rounds 3 --budget-s "$BUDGET_S" --json "$OUT/decode.json" --markdown "$OUT/decode.md" \
        --plot "$OUT/decode.png" 2>&1 | grep -v "^[VWI][0-9]" | tee -a "$LOG"
fi
say "done (rc=$RC)"
exit $RC
