#!/usr/bin/env bash
# Decode speed at every context length on a CUDA machine: the whole GPU test tier (pytest -m gpu),
# then decode_compare's context sweep (three families, static and paged caches, compiled step,
# accuracy against a float32 reference, eager rounds against transformers).
#
#   OUT=/some/dir scripts/gpu_decode.sh                      # from the repository root
#   OUT=/some/dir STAGES="sweep" CONTEXTS="128 4096" scripts/gpu_decode.sh   # a part
#   OUT=/some/dir STAGES="profile" scripts/gpu_decode.sh    # the compiled step's kernels (not by default;
#                                                           # PROFILE_MODEL picks the model, llama-3.2-1b)
#   OUT=/some/dir STAGES="bench" scripts/gpu_decode.sh      # the fused kernels' benchmarks (not by default)
#   OUT=/some/dir STAGES="tests-gemv" scripts/gpu_decode.sh # the GPU tier in three parts, for machines
#   (then STAGES="tests-attention", STAGES="tests-rest")    # whose commands stop at 10 minutes
#
# Needs torch (CUDA), Triton, transformers, pytest, matplotlib; no network. The sweep alone takes
# about 6 minutes on an H100 for two contexts (torch.compile of each decoder is most of it) and
# skips, and lists, what would run past BUDGET_S; the GPU tier stops at TESTS_TIMEOUT_S (default 560:
# one call of a machine with a 10-minute limit). Writes into $OUT: log.txt, tests.log, tests.xml,
# decode.json, decode.md, decode.png. Exits non-zero when a test fails.
set -u
OUT=${OUT:?set OUT to the results folder}
mkdir -p "$OUT"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
STAGES=${STAGES:-tests sweep}
CONTEXTS=${CONTEXTS:-128 1024 4096 16384}
BUDGET_S=${BUDGET_S:-1500}
# More workers compile faster but share the GPU's memory: at 10, the 4 GiB weight of the GEMV
# int32-addressing test no longer fitted beside the others (H100, 80 GB).
WORKERS=${WORKERS:-4}
# Workers of one part of the tier (tests-gemv, tests-attention, tests-rest): a part holds fewer of
# the big-memory tests at once, and 8 fitted on an H100.
PART_WORKERS=${PART_WORKERS:-8}
TESTS_TIMEOUT_S=${TESTS_TIMEOUT_S:-560}
PROFILE_MODEL=${PROFILE_MODEL:-llama-3.2-1b}
LOG="$OUT/log.txt"
: >"$LOG"
say() { echo "[gpu_decode $(date +%H:%M:%S)] $*" | tee -a "$LOG"; }
want() { [[ " $STAGES " == *" $1 "* ]]; }
RC=0

KERNEL_TESTS=(tests/kernels/test_gemv_gpu.py tests/kernels/test_decode_attention_gpu.py)
tier_part() {  # name, pytest arguments: one part of the GPU tier, its log tests_<name>.log
    local name=$1
    shift
    say "tests: pytest -m gpu -n $PART_WORKERS $* (a part of the GPU tier)"
    timeout "$TESTS_TIMEOUT_S" $PY -m pytest -m gpu -n "$PART_WORKERS" -p no:cacheprovider -q -rs "$@" \
        >"$OUT/tests_$name.log" 2>&1 || RC=1
    tail -3 "$OUT/tests_$name.log" | tee -a "$LOG"
}
# On an H100 with 8 workers the two kernel files took 9:22 together, the rest 1:25 (2026-11-24).
want tests-gemv && tier_part gemv "${KERNEL_TESTS[0]}"
want tests-attention && tier_part attention "${KERNEL_TESTS[1]}"
want tests-rest && tier_part rest --ignore "${KERNEL_TESTS[0]}" --ignore "${KERNEL_TESTS[1]}"
if want tests; then
    # The whole GPU tier, the "pytest -m gpu", in $WORKERS processes sharing the GPU: most of
    # its time is Triton and Inductor compiling on the CPU, which the workers spread over the cores.
    say "tests: pytest -m gpu -n $WORKERS (the whole GPU tier)"
    timeout "$TESTS_TIMEOUT_S" $PY -m pytest -m gpu -n "$WORKERS" -p no:cacheprovider -q -rs \
        --junitxml "$OUT/tests.xml" >"$OUT/tests.log" 2>&1 || RC=1
    tail -5 "$OUT/tests.log" | tee -a "$LOG"
fi
if want profile; then
    # Where a compiled step's time goes, per kernel, with Inductor's generated code (to tell which
    # of its small kernels are norms, RoPE or copies): profile.json, profile.txt, inductor_code.txt.
    say "profile: $PROFILE_MODEL compiled step at 128 positions"
    TORCH_LOGS=output_code timeout 300 $PY benchmarks/profile_decode.py --model "$PROFILE_MODEL" --compile tuned \
        --compiled-only --top 40 --json "$OUT/profile.json" >"$OUT/profile.txt" 2>"$OUT/inductor_code.txt" || RC=1
    tail -45 "$OUT/profile.txt" | tee -a "$LOG"
fi
if want bench; then
    # The fused attention against the chain it replaces, per family and context, with the tile
    # knobs the head-dim table chose between; the projections swept with their fused stages; a
    # layer's chain of fused projections.
    say "bench: bench_decode_attention, bench_gemv --stages, bench_gemv --mode chain"
    timeout 300 $PY benchmarks/bench_decode_attention.py --contexts 128 1024 4096 16384 \
        --knobs preload=0 preload=1 preload=1,block_n=64,first_n=64,num_warps=4 preload=1,block_n=32,first_n=32,num_warps=4 \
        preload=1,block_n=16,first_n=16,num_warps=2 preload=1,block_n=16,first_n=32,num_warps=2 preload=1,block_n=16,first_n=128,num_warps=4 \
        preload=1,heads_per_program=1,first_n=16 \
        --json "$OUT/decode_attention.json" 2>&1 | tee -a "$LOG" | tail -14
    timeout 300 $PY benchmarks/bench_gemv.py --stages --rows 1 --json "$OUT/gemv_stages.json" >"$OUT/gemv_stages.txt" 2>&1 || RC=1
    grep -A16 "^# best batch-1" "$OUT/gemv_stages.txt" | tee -a "$LOG"
    timeout 300 $PY benchmarks/bench_gemv.py --mode chain --json "$OUT/gemv_chain.json" 2>&1 | tee -a "$LOG" | tail -40
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
