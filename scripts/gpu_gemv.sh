#!/usr/bin/env bash
# The decode matrix-vector kernels (infer_ref/fast/kernels/gemv/) on a CUDA machine: the GPU tests
# against the float64 oracle, the launch-config sweep against cuBLAS (its best configs print as the
# tables to paste into gemv.py), the per-layer chain of fused projections (norms and residual adds
# folded in) under a CUDA graph, then planted-bug kernels that the GPU tests must catch.
#
#   OUT=/some/dir scripts/gpu_gemv.sh                  # from the repository root; about 20 minutes on an H100
#   OUT=/some/dir STAGES="bench chain" scripts/gpu_gemv.sh   # a part (any of: tests bench chain mutants)
#   OUT=/some/dir STAGES="interpret-mutants" scripts/gpu_gemv.sh   # no GPU: the same planted bugs
#       against the Triton-interpreter tests of tests/kernels/test_gemv.py (float16/float32, CPU)
#
# Needs torch (CUDA), Triton, pytest; no network. Writes into $OUT: log.txt, tests.xml (JUnit),
# gemv.json (the sweep), gemv_chain.json (the chain). Exits non-zero when a test fails or a planted
# bug goes uncaught (for interpret-mutants: never for an uncaught one, which the interpreter's
# float16/float32 tests may legitimately miss; the log says which).
NAME=gpu_gemv
DEFAULT_STAGES="tests bench chain mutants"
# shellcheck source=scripts/gpu_common.sh
source "$(dirname "$0")/gpu_common.sh"

gpu_environment

if want tests; then
    say "tests: pytest -m gpu tests/kernels/test_gemv_gpu.py"
    timeout 2400 $PY -m pytest -m gpu tests/kernels/test_gemv_gpu.py -q -p no:cacheprovider -rs --junitxml "$OUT/tests.xml" 2>&1 | tee -a "$LOG"
    rc=${PIPESTATUS[0]}; [ "$rc" = 0 ] || RC=1
    say "tests: rc=$rc"
fi

if want bench; then
    say "benchmark: benchmarks/bench_gemv.py"
    timeout 600 $PY benchmarks/bench_gemv.py --json "$OUT/gemv.json" 2>&1 | tee -a "$LOG"
    say "benchmark: rc=${PIPESTATUS[0]}"
fi

if want chain; then
    say "benchmark: benchmarks/bench_gemv.py --mode chain"
    timeout 900 $PY benchmarks/bench_gemv.py --mode chain --json "$OUT/gemv_chain.json" 2>&1 | tee -a "$LOG"
    say "chain: rc=${PIPESTATUS[0]}"
fi

# mutant NAME OLD NEW GPU_TESTS INTERPRET_TESTS [FILE]: a copy of the package with OLD replaced by
# NEW in infer_ref/fast/kernels/FILE (default gemv/kernel.py: the kernels; gemv/launch.py their launch); the GPU
# tests selected by -k GPU_TESTS must fail on it (stopping at the first failure). In the
# interpret-mutants stage the interpreter tests selected by -k INTERPRET_TESTS run instead ("-":
# none can, e.g. int32 addressing, PDL).
MODE=gpu
mutant() {
    local name=$1 old=$2 new=$3 sel=$4 isel=$5 file=${6:-gemv/kernel.py} dir result
    if [ "$MODE" = interpret ] && [ "$isel" = - ]; then say "mutant $name: no interpreter test applies"; return; fi
    dir=$(mktemp -d)
    cp -r infer_ref tests benchmarks conftest.py pyproject.toml "$dir"/
    $PY - "$dir/infer_ref/fast/kernels/$file" "$old" "$new" <<'PYEOF' || { say "mutant $name: its source line is gone, update this script"; RC=1; rm -rf "$dir"; return; }
import sys
path, old, new = sys.argv[1:]
text = open(path).read()
if text.count(old) != 1:
    sys.exit(1)
open(path, "w").write(text.replace(old, new))
PYEOF
    if [ "$MODE" = interpret ]; then
        result=$(cd "$dir" && TRITON_INTERPRET=1 timeout 900 $PY -m pytest tests/kernels/test_gemv.py -m interpret -q -p no:cacheprovider -x -n 2 -k "$isel" 2>&1 | tail -1)
    else
        result=$(cd "$dir" && timeout 300 $PY -m pytest -m gpu tests/kernels/test_gemv_gpu.py -q -p no:cacheprovider -x -k "$sel" 2>&1 | tail -1)
    fi
    # "failed" is a catch; an error alone (a collection or import error) is a broken run, not a catch.
    if [[ "$result" == *failed* ]]; then say "mutant $name: caught ($result)"
    elif [[ "$result" == *error* ]]; then say "mutant $name: BROKEN RUN ($result)"; RC=1
    else say "mutant $name: MISSED ($result)"; [ "$MODE" = interpret ] || RC=1; fi
    rm -rf "$dir"
}
ODD="odd_shapes and bf16"
FUSED_ODD="fused_stages_odd_shapes_every_path and bf16"
ITP="kernels_under_interpreter"
ISTAGES="fused_stages_under_interpreter"
all_mutants() {
    mutant combine_drops_last_split "for s in range(0, splits):" "for s in range(0, splits - 1):" "$ODD" "$ITP"
    mutant last_tile_dropped "for tile in range(PREFETCH_TILES, tiles_per_split):" "for tile in range(PREFETCH_TILES, tiles_per_split - 1):" "$ODD" "$ITP"
    mutant up_rows_are_gate_rows "(offs_n + up_offset).to(tl.int64)" "(offs_n + 0 * up_offset).to(tl.int64)" "$ODD" "$ITP"
    mutant bias_ignored "acc = acc + tl.load(bias_ptr" "acc = acc + 0.0 * tl.load(bias_ptr" "$ODD" "$ITP"
    mutant unmasked_tail_of_k "EVEN_K=splits * k_per_split == k" "EVEN_K=True" "$ODD" "$ITP" gemv/launch.py
    mutant first_row_only "m_ok = offs_m < rows" "m_ok = offs_m < 1" "$ODD" "$ITP"
    mutant gelu_is_silu "if ACT == 0:" "if ACT >= 0:" "$ODD" "$ITP"
    mutant combine_reads_row_zero "base = part_ptr + row * stride_pm" "base = part_ptr + 0 * stride_pm" "$ODD" "$ITP"
    mutant int32_row_addresses "w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * k" "w_rows = w_ptr + offs_n[:, None] * k" "int32" -
    mutant gate_not_rounded "g = acc.to(OUT_DTYPE).to(tl.float32)" "g = acc" "exact" "exact_sums_round_like_eager_under_interpreter"
    mutant activation_not_rounded "a = a.to(OUT_DTYPE).to(tl.float32)" "a = a" "exact" "exact_sums_round_like_eager_under_interpreter"
    # Every kernel lets its successor start but no longer waits for its predecessor (kernels/common.py).
    mutant no_dependency_wait "gdc_wait()" "pass" "chain" - common.py
    # -- the fused stages
    mutant norm_weight_ignored "w = w.to(tl.float32)[None, :]" "w = w.to(tl.float32)[None, :] * 0.0 + (0.0 if UNIT_OFFSET else 1.0)" "$FUSED_ODD" "$ISTAGES"
    mutant rstd_from_part_of_k "ok = (offs < k) & (r < rows)" "ok = (offs < k // 2) & (r < rows)" "$FUSED_ODD" "$ISTAGES"
    mutant in_norm_mean_over_padded_k "_rstd(tl.sum(sum_sq, axis=0), k, eps)" "_rstd(tl.sum(sum_sq, axis=0), NORM_BLOCK, eps)" "$FUSED_ODD" "$ISTAGES"
    mutant gemma_formula_swapped "h = n * (1.0 + w) if UNIT_OFFSET else" "h = n * (1.0 + w) if not UNIT_OFFSET else" "$FUSED_ODD" "$ISTAGES"
    mutant llama_normalised_not_rounded "else w * n.to(t.dtype).to(tl.float32)" "else w * n" "in_norm_rounds_like_rms_norm and bf16" "in_norm_rounds_like_rms_norm_under_interpreter"
    mutant gemma_normalised_rounded_first "h = n * (1.0 + w) if UNIT_OFFSET" "h = n.to(t.dtype).to(tl.float32) * (1.0 + w) if UNIT_OFFSET" "in_norm_rounds_like_rms_norm and bf16" "in_norm_rounds_like_rms_norm_under_interpreter"
    mutant residual_before_rounding "                y = _plus_residual(r, y.to(tl.float32), y.dtype)" "                y = _plus_residual(r, sums, y.dtype)" "exact_sums_epilogue" "exact_sums_round_like_eager_under_interpreter"
    mutant out_norm_over_a_column_block "sum_sq += tl.sum(y32 * y32, axis=1)" "sum_sq = tl.sum(y32 * y32, axis=1)" "wider_than_its_block" "wider_than_its_block_under_interpreter"
    mutant out_norm_mean_over_padded_row "rstd = _rstd(tl.sum(y32 * y32, axis=1), n_out, eps)" "rstd = _rstd(tl.sum(y32 * y32, axis=1), BLOCK, eps)" "$FUSED_ODD" "$ISTAGES"
    mutant out_norm_without_partials "partials = splits > 1 or out_norm is not None" "partials = splits > 1" "fused_stages_on_real_shapes and gemma and bf16" "$ISTAGES" gemv/launch.py
    mutant split_residual_dropped "BLOCK=COMBINE_BLOCK, HAS_RESIDUAL=residual is not None" "BLOCK=COMBINE_BLOCK, HAS_RESIDUAL=False" "fused_stages_on_real_shapes and bf16" "$ISTAGES" gemv/launch.py
    mutant out_norm_residual_dropped "HAS_RESIDUAL=residual is not None, num_warps=8" "HAS_RESIDUAL=False, num_warps=8" "fused_stages_on_real_shapes and gemma and bf16" "$ISTAGES" gemv/launch.py
    mutant prefetched_tile_used_twice "for tile in range(PREFETCH_TILES, tiles_per_split):" "for tile in range(0, tiles_per_split):" "$FUSED_ODD" "$ISTAGES"
    mutant prefetched_tile_skipped "_mac_tiles(acc, acc_up, xt, w_first, wu_first," "_mac_tiles(acc, acc_up, xt, w_first * 0, wu_first," "$FUSED_ODD" "$ISTAGES"
    mutant prefetched_tile_not_normalised "offs_k < k, norm_w_ptr, rstd, EVEN_K, IN_NORM, UNIT_OFFSET" "offs_k < k, norm_w_ptr, rstd, EVEN_K, False, UNIT_OFFSET" "$FUSED_ODD" "$ISTAGES"
}
if want mutants; then
    MODE=gpu
    all_mutants
fi
if want interpret-mutants; then
    MODE=interpret
    all_mutants
fi

say "done in ${SECONDS}s (rc=$RC)"
exit "$RC"
