#!/usr/bin/env bash
# The fused decode attention kernel (infer_ref/fast/kernels/attention/) on a CUDA machine: the
# GPU tests against the torch reference, the benchmark against the unfused chain it replaces, then
# planted-bug kernels that the GPU tests must catch.
#
#   OUT=/some/dir scripts/gpu_decode_attention.sh                      # from the repository root; 20-30 minutes on an H100 (estimate)
#   OUT=/some/dir STAGES="bench" scripts/gpu_decode_attention.sh       # a part (any of: tests bench mutants interpret)
#   OUT=/some/dir STAGES="interpret" scripts/gpu_decode_attention.sh   # the same planted bugs against the
#                                                                      # interpreter tests: runs on a CPU (about 10 minutes)
#
# Needs torch (CUDA), Triton, pytest (pytest-xdist for the interpret stage); no network. Writes into
# $OUT: log.txt, tests.xml (JUnit), decode_attention.json (the benchmark). Exits non-zero when a test
# fails or a planted bug goes uncaught by the GPU tests (the interpret stage only reports: some
# bugs, such as int32 addressing, need a GPU-sized pool to show).
NAME=gpu_decode_attention
DEFAULT_STAGES="tests bench mutants"
# shellcheck source=scripts/gpu_common.sh
source "$(dirname "$0")/gpu_common.sh"
GPU_TESTS=tests/kernels/test_decode_attention_gpu.py
INTERPRET_TESTS=tests/kernels/test_decode_attention_interpret.py

say "environment"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || true
  $PY -c 'import torch, sys, triton; print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__, "gpu", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)'
  git rev-parse --short HEAD 2>/dev/null || true; } 2>&1 | tee -a "$LOG"

if want tests; then
    say "tests: pytest -m gpu $GPU_TESTS"
    timeout 1800 $PY -m pytest -m gpu $GPU_TESTS -q -p no:cacheprovider -rs --junitxml "$OUT/tests.xml" 2>&1 | tee -a "$LOG"
    rc=${PIPESTATUS[0]}; [ "$rc" = 0 ] || RC=1
    say "tests: rc=$rc"
    say "tests: the paged attention's own GPU tests (the same kernel, prep off): tests/unit/test_kernels_gpu.py"
    timeout 900 $PY -m pytest -m gpu tests/unit/test_kernels_gpu.py -q -p no:cacheprovider 2>&1 | tail -3 | tee -a "$LOG"
    rc=${PIPESTATUS[0]}; [ "$rc" = 0 ] || RC=1
    say "tests (paged): rc=$rc"
fi

if want bench; then
    say "benchmark: benchmarks/bench_decode_attention.py"
    timeout 900 $PY benchmarks/bench_decode_attention.py --json "$OUT/decode_attention.json" 2>&1 | tee -a "$LOG"
    say "benchmark: rc=${PIPESTATUS[0]}"
fi

# mutant NAME OLD NEW GPU_SELECTION [FILE]: a copy of the package with OLD replaced by NEW (exactly
# one occurrence) in infer_ref/fast/kernels/FILE (default attention/kernel.py); in the mutants stage the
# GPU tests selected by -k GPU_SELECTION must fail on it, in the interpret stage the interpreter
# tests (all of them, stopping at the first failure).
MODE=gpu
mutant() {
    local name=$1 old=$2 new=$3 sel=$4 file=${5:-attention/kernel.py} dir
    dir=$(mktemp -d)
    cp -r infer_ref tests conftest.py pyproject.toml "$dir"/
    $PY - "$dir/infer_ref/fast/kernels/$file" "$old" "$new" <<'PYEOF' || { say "mutant $name: its source line is gone, update this script"; RC=1; rm -rf "$dir"; return; }
import sys
path, old, new = sys.argv[1:]
text = open(path).read()
if text.count(old) != 1:
    sys.exit(1)
open(path, "w").write(text.replace(old, new))
PYEOF
    local result
    if [ "$MODE" = gpu ]; then
        result=$(cd "$dir" && timeout 600 $PY -m pytest -m gpu $GPU_TESTS -q -p no:cacheprovider -x -k "$sel" 2>&1 | tail -1)
    else
        result=$(cd "$dir" && TRITON_INTERPRET=1 timeout 900 $PY -m pytest -m interpret $INTERPRET_TESTS -q -p no:cacheprovider -x -n 2 2>&1 | tail -1)
    fi
    if [[ "$result" == *failed* || "$result" == *error* ]]; then
        say "mutant $name ($MODE): caught ($result)"
    else
        say "mutant $name ($MODE): MISSED ($result)"
        [ "$MODE" = gpu ] && RC=1
    fi
    rm -rf "$dir"
}

planted_bugs() {
    local FS="family_shapes and bf16" W="windows" G="graph"
    # The prep stages: V must never be rotated; the q norm comes before RoPE; the norm's weight is
    # applied (Llama: w * x; Gemma: 1 + w); Llama's formula rounds x * rstd before the weight;
    # rotate_half's sign.
    mutant v_rotated \
        "v_new = tl.load(v_row + e[None, :] * stride_nvd, mask=e_ok[None, :], other=0.0)  # V: as is" \
        "v_new = _rotated(tl.load(v_row + e[None, :] * stride_nvd, mask=e_ok[None, :], other=0.0), tl.load(v_row + partner[None, :] * stride_nvd, mask=e_ok[None, :], other=0.0), cos, sin, first_half)" "$FS"
    mutant q_norm_after_rope \
        "q = _prep_heads(q, q_p, q_w, q_w_partner, q_eps, cos, sin, first_half, HEAD_DIM, Q_NORM, ROPE)" \
        "q = _normed(_rotated(q, q_p, cos, sin, first_half), q_w, _rstd(q, q_eps, HEAD_DIM), Q_NORM)" "$FS and (qwen3 or gemma3)"
    mutant norm_weight_ignored "w32 = w.to(tl.float32)[None, :]" "w32 = 0.0 * w.to(tl.float32)[None, :] + 1.0" "$FS and (qwen3 or gemma3)"
    mutant llama_norm_not_rounded_before_weight "(w32 * (x32 * rstd[:, None]).to(x.dtype).to(tl.float32))" "(w32 * (x32 * rstd[:, None]))" "$FS and qwen3"
    mutant rotate_half_sign "rot = tl.where(first_half[None, :], -partner, partner)" "rot = tl.where(first_half[None, :], partner, -partner)" "$FS"
    # The new token: stored by exactly the program whose split holds n - 1, never read back.
    mutant owner_does_not_store "if (split == owner) & (n > 0) & (first_head % GROUP == 0):" "if (split == owner) & (n < 0) & (first_head % GROUP == 0):" "$FS"
    mutant owner_misidentified "owner = (n - 1 - first) // chunk" "owner = (n - 1) // chunk" "$W"
    mutant new_key_read_from_cache "is_new = pos == new_pos" "is_new = pos < 0" "$FS"
    # Attention: the window, GQA heads, the split ranges.
    mutant window_off_by_one "first = tl.where(window > 0, tl.maximum(n - window, 0), 0)" "first = tl.where(window > 0, tl.maximum(n - window + 1, 0), 0)" "$W"
    mutant gqa_heads_interleaved "q_heads = first_head + g.to(tl.int64)" "q_heads = (g * NUM_KV_HEADS + kvh).to(tl.int64)" "$FS"
    mutant reads_one_past_the_length "return used, owner, start, tl.minimum(start + chunk, n)" "return used, owner, start, tl.minimum(start + chunk, n + 1)" "$FS"
    # The in-kernel combine: every split, rescaled, by the last arrival, counters reset.
    mutant combine_drops_last_split "ok = (spc < used)[:, None] & gc_ok[None, :]" "ok = (spc < used - 1)[:, None] & gc_ok[None, :]" "$FS"
    mutant splits_not_rescaled \
        'w = tl.exp(tl.load(part_max_ptr + idx, mask=ok, other=float("-inf"), cache_modifier=".cg") - m_all[None, :])' \
        'w = 1.0 + 0.0 * tl.load(part_max_ptr + idx, mask=ok, other=0.0, cache_modifier=".cg")' "$FS"
    mutant last_arrival_misdetected "if arrived == used - 1:" "if arrived == used - 2:" "$FS"
    mutant counter_not_reset "tl.store(counter_ptr + row_head, 0)  # ready for the next launch" "pass" "$FS"
    # Addressing: block ids times strides in int32 overflow past 2**31 elements.
    mutant int32_pool_addressing \
        "return tl.load(table_row + (pos // block_size) * stride_tm, mask=live, other=0).to(tl.int64)" \
        "return tl.load(table_row + (pos // block_size) * stride_tm, mask=live, other=0).to(tl.int32)" "int32"
    # Programmatic dependent launch: the kernel lets its successor start but no longer waits for its
    # predecessor (kernels/common.py): the chained-layers graph must show it.
    mutant no_dependency_wait "gdc_wait()" "pass" "$G" common.py
    # The preload: a first tile read through stale lengths or tables must be read again. On a GPU
    # the stale case is a race the tests cannot force, so only the interpreter tests (which pass
    # stale hints on purpose) are asked to catch it.
    [ "$MODE" = interpret ] && mutant stale_preload_kept "            if stale:" "            if stale & False:" "preload"
    [ "$MODE" = interpret ] && mutant preload_table_not_checked \
        "(tl.sum((check_block != hint_block).to(tl.int32), axis=0) != 0)" "(n < 0)" "preload"
}

if want mutants; then
    MODE=gpu
    planted_bugs
fi
if want interpret; then
    MODE=interpret
    planted_bugs
fi

say "done in ${SECONDS}s (rc=$RC)"
exit "$RC"
