#!/usr/bin/env bash
# Triton kernels on a CUDA machine: the GPU tests against the references, the paged decode
# micro-benchmark (kernel vs gather + SDPA, Llama-3.2-1B attention shape, bf16), then planted-bug
# kernels (each must make the GPU tests fail: proof that they can).
#
#   OUT=/some/dir scripts/gpu_kernels.sh                 # from the repository root; about 2 minutes on an H100
#   OUT=/some/dir STAGES="tests" scripts/gpu_kernels.sh  # a part (any of: tests bench mutants)
#
# Needs torch (CUDA), Triton, pytest; no network. Writes into $OUT: log.txt, tests.xml (JUnit),
# bench_kernels.json. Exits non-zero when a test fails or a planted bug goes uncaught.
NAME=gpu_kernels
DEFAULT_STAGES="tests bench mutants"
# shellcheck source=scripts/gpu_common.sh
source "$(dirname "$0")/gpu_common.sh"

gpu_environment

if want tests; then
    say "tests: pytest -m gpu tests/unit/test_kernels_gpu.py"
    timeout 900 $PY -m pytest -m gpu tests/unit/test_kernels_gpu.py -q -p no:cacheprovider --junitxml "$OUT/tests.xml" 2>&1 | tee -a "$LOG"
    rc=${PIPESTATUS[0]}; [ "$rc" = 0 ] || RC=1
    say "tests: rc=$rc"
fi

if want bench; then
    say "benchmark: benchmarks/bench_kernels.py"
    timeout 600 $PY benchmarks/bench_kernels.py --out "$OUT/bench_kernels.json" 2>&1 | tee -a "$LOG"
    say "benchmark: rc=${PIPESTATUS[0]}"
fi

# mutant NAME FILE OLD NEW TESTS: a copy of the package with OLD replaced by NEW in FILE; the GPU
# tests selected by -k TESTS must fail on it.
mutant() {
    local name=$1 file=$2 old=$3 new=$4 sel=$5 dir
    dir=$(mktemp -d)
    cp -r infer_ref tests conftest.py pyproject.toml "$dir"/
    $PY - "$dir/$file" "$old" "$new" <<'PYEOF' || { say "mutant $name: its source line is gone, update this script"; RC=1; return; }
import sys
path, old, new = sys.argv[1:]
text = open(path).read()
if old not in text:
    sys.exit(1)
open(path, "w").write(text.replace(old, new))
PYEOF
    local result
    result=$(cd "$dir" && timeout 300 $PY -m pytest -m gpu tests/unit/test_kernels_gpu.py -q -p no:cacheprovider -x -k "$sel" 2>&1 | tail -1)
    if [[ "$result" == *failed* ]]; then say "mutant $name: caught ($result)"; else say "mutant $name: MISSED ($result)"; RC=1; fi
    rm -rf "$dir"
}
if want mutants; then
    PA=infer_ref/fast/kernels/attention/kernel.py ST=infer_ref/fast/kernels/store/kernel.py
    mutant window_off_by_one $PA "tl.maximum(n - window, 0)" "tl.maximum(n - window - 1, 0)" window
    mutant window_ignored $PA "first = tl.where(window > 0, tl.maximum(n - window, 0), 0)" "first = 0" window
    mutant minus_one_wraps $ST "slot = tl.load(slot_ptr + token).to(tl.int64)" \
        "slot = tl.load(slot_ptr + token).to(tl.int64); slot = (slot + num_slots) % num_slots" store
    mutant int32_addressing $ST "slot = tl.load(slot_ptr + token).to(tl.int64)" "slot = tl.load(slot_ptr + token).to(tl.int32)" int32
    mutant splits_not_rescaled $PA 'w = tl.exp(tl.load(part_max_ptr + idx, mask=ok, other=float("-inf"), cache_modifier=".cg") - m_all[None, :])' 'w = 1.0 + 0.0 * tl.load(part_max_ptr + idx, mask=ok, other=0.0, cache_modifier=".cg")' decode
    mutant gqa_heads_interleaved $PA "q_heads = first_head + g.to(tl.int64)" "q_heads = (g * NUM_KV_HEADS + kvh).to(tl.int64)" decode
    mutant reads_one_past_the_length $PA "return used, owner, start, tl.minimum(start + chunk, n)" "return used, owner, start, tl.minimum(start + chunk, n + 1)" decode
    mutant first_rows_length_for_all $PA "n = tl.load(lens_ptr + row * stride_lb).to(tl.int32)" "n = tl.load(lens_ptr).to(tl.int32)" decode
fi

say "done in ${SECONDS}s (rc=$RC)"
exit "$RC"
