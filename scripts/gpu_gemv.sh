#!/usr/bin/env bash
# The decode matrix-vector kernels (infer_ref/kernels/gemv.py) on a CUDA machine: the GPU tests
# against the float64 oracle, the launch-config sweep against cuBLAS (its best configs print as the
# tables to paste into gemv.py), then planted-bug kernels that the GPU tests must catch.
#
#   OUT=/some/dir scripts/gpu_gemv.sh                  # from the repository root; about 10 minutes on an H100
#   OUT=/some/dir STAGES="bench" scripts/gpu_gemv.sh   # a part (any of: tests bench mutants)
#
# Needs torch (CUDA), Triton, pytest; no network. Writes into $OUT: log.txt, tests.xml (JUnit),
# gemv.json (the sweep). Exits non-zero when a test fails or a planted bug goes uncaught.
set -u
OUT=${OUT:?set OUT to the results folder}
mkdir -p "$OUT"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
LOG="$OUT/log.txt"
: >"$LOG"
say() { echo "[gpu_gemv $(date +%H:%M:%S)] $*" | tee -a "$LOG"; }

STAGES=${STAGES:-tests bench mutants}
want() { [[ " $STAGES " == *" $1 "* ]]; }
RC=0

say "environment"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || true
  $PY -c 'import torch, sys; import triton; print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__, "gpu", torch.cuda.get_device_name(0))'
  git rev-parse --short HEAD 2>/dev/null || true; } 2>&1 | tee -a "$LOG"

if want tests; then
    say "tests: pytest -m gpu tests/kernels/test_gemv_gpu.py"
    timeout 1200 $PY -m pytest -m gpu tests/kernels/test_gemv_gpu.py -q -p no:cacheprovider -rs --junitxml "$OUT/tests.xml" 2>&1 | tee -a "$LOG"
    rc=${PIPESTATUS[0]}; [ "$rc" = 0 ] || RC=1
    say "tests: rc=$rc"
fi

if want bench; then
    say "benchmark: benchmarks/bench_gemv.py"
    timeout 600 $PY benchmarks/bench_gemv.py --json "$OUT/gemv.json" 2>&1 | tee -a "$LOG"
    say "benchmark: rc=${PIPESTATUS[0]}"
fi

# mutant NAME OLD NEW TESTS [FILE]: a copy of the package with OLD replaced by NEW in
# infer_ref/kernels/FILE (default gemv.py); the GPU tests selected by -k TESTS must fail on it
# (stopping at the first failure).
mutant() {
    local name=$1 old=$2 new=$3 sel=$4 file=${5:-gemv.py} dir
    dir=$(mktemp -d)
    cp -r infer_ref tests conftest.py pyproject.toml "$dir"/
    $PY - "$dir/infer_ref/kernels/$file" "$old" "$new" <<'PYEOF' || { say "mutant $name: its source line is gone, update this script"; RC=1; return; }
import sys
path, old, new = sys.argv[1:]
text = open(path).read()
if text.count(old) != 1:
    sys.exit(1)
open(path, "w").write(text.replace(old, new))
PYEOF
    local result
    result=$(cd "$dir" && timeout 300 $PY -m pytest -m gpu tests/kernels/test_gemv_gpu.py -q -p no:cacheprovider -x -k "$sel" 2>&1 | tail -1)
    if [[ "$result" == *failed* || "$result" == *error* ]]; then say "mutant $name: caught ($result)"; else say "mutant $name: MISSED ($result)"; RC=1; fi
    rm -rf "$dir"
}
if want mutants; then
    mutant combine_drops_last_split "for s in range(0, splits):" "for s in range(0, splits - 1):" "odd_shapes and bf16"
    mutant last_tile_dropped "for tile in range(0, tiles_per_split):" "for tile in range(0, tiles_per_split - 1):" "odd_shapes and bf16"
    mutant up_rows_are_gate_rows "(offs_n + up_offset).to(tl.int64)" "(offs_n + 0 * up_offset).to(tl.int64)" "odd_shapes and bf16"
    mutant bias_ignored "acc = acc + tl.load(bias_ptr" "acc = acc + 0.0 * tl.load(bias_ptr" "odd_shapes and bf16"
    mutant unmasked_tail_of_k "EVEN_K=splits * k_per_split == k" "EVEN_K=True" "odd_shapes and bf16"
    mutant first_row_only "m_ok = offs_m < rows" "m_ok = offs_m < 1" "odd_shapes and bf16"
    mutant gelu_is_silu "if ACT == 0:" "if ACT >= 0:" "odd_shapes and bf16"
    mutant combine_reads_row_zero "base = part_ptr + row * stride_pm" "base = part_ptr + 0 * stride_pm" "odd_shapes and bf16"
    mutant int32_row_addresses "w_rows = w_ptr + offs_n.to(tl.int64)[:, None] * k" "w_rows = w_ptr + offs_n[:, None] * k" "int32"
    mutant gate_not_rounded "g = acc.to(OUT_DTYPE).to(tl.float32)" "g = acc" "exact"
    mutant activation_not_rounded "a = a.to(OUT_DTYPE).to(tl.float32)" "a = a" "exact"
    # Every kernel lets its successor start but no longer waits for its predecessor (kernels/pdl.py).
    mutant no_dependency_wait "gdc_wait()" "pass" "chain" pdl.py
fi

say "done in ${SECONDS}s (rc=$RC)"
exit "$RC"
