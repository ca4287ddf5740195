#!/usr/bin/env bash
# The re-layering's GPU checks in one script: the GPU tier on this tree (every test marked gpu),
# the fast CLI path (captured and compiled), and the compiled decode step of the tree before the
# re-layering (a669f17) against this one (scripts/gpu_ab.sh, three families at 128 and 4096), the
# planted GPU kernel bugs (the mutants stages of gpu_kernels.sh, gpu_gemv.sh, gpu_decode_attention.sh),
# and the CPU default tier of both trees on the same two cores with CUDA hidden (what CI runs).
#
#   git archive a669f17 infer_ref benchmarks | (mkdir -p .ab/old && tar -x -C .ab/old)
#   OUT=/some/dir scripts/gpu_relayer.sh                  # from the repository root
#   OUT=/some/dir STAGES="tier" scripts/gpu_relayer.sh    # a part (any of: tier cli ab mutants cpu-tier)
#   git archive a669f17 | (mkdir -p .ab/tier-old && tar -x -C .ab/tier-old)   # for cpu-tier
#
# Writes into $OUT: log.txt, tier_{gemv,attention,rest}.{log,xml}, ab/ (gpu_ab.sh's logs and ab.txt),
# mutants/ (each script's log), cpu_{old,new}.{log,xml}. Exits non-zero when a test fails or a planted
# bug is missed.
NAME=gpu_relayer
DEFAULT_STAGES="tier cli ab"
# shellcheck source=scripts/gpu_common.sh
source "$(dirname "$0")/gpu_common.sh"

gpu_environment

if want tier; then
    # Three parts (the GEMV kernels, the attention kernels, the rest), each over WORKERS processes
    # sharing the GPU; each part's whole output in tier_<part>.log, its summary in log.txt.
    K=tests/kernels
    for part in "gemv:$K/test_gemv_gpu.py" "attention:$K/test_decode_attention_gpu.py" \
                "rest:tests infer_ref/conformance/tests --deselect $K/test_gemv_gpu.py --deselect $K/test_decode_attention_gpu.py"; do
        name=${part%%:*}
        say "tier $name: pytest -m gpu -n ${WORKERS:-4} ${part#*:}"
        # shellcheck disable=SC2086  # the part's paths and options are a list
        $PY -m pytest -m gpu -q -p no:cacheprovider -n "${WORKERS:-4}" --junitxml="$OUT/tier_$name.xml" ${part#*:} \
            >"$OUT/tier_$name.log" 2>&1 || RC=1
        grep -E "passed|failed|error" "$OUT/tier_$name.log" | tail -3 | tee -a "$LOG"
    done
fi
if want cli; then
    say "cli: infer-ref generate --fast, then --fast --compile (llama-tiny)"
    for flags in "--fast" "--fast --compile"; do
        # shellcheck disable=SC2086  # flags is a list
        $PY -m infer_ref.cli generate "Count to ten." --device cuda $flags --max-new-tokens 16 2>&1 | tail -3 | tee -a "$LOG"
        [[ ${PIPESTATUS[0]} -eq 0 ]] || RC=1
    done
fi
if want ab; then
    say "ab: a669f17 (.ab/old) against this tree"
    OUT="$OUT/ab" TREES="old=.ab/old new=." CONTEXT="128 4096" BUDGET_S=${BUDGET_S:-480} bash scripts/gpu_ab.sh 2>&1 | tee -a "$LOG"
fi
if want mutants; then
    # The three scripts share the GPU; each copies the package per planted bug and runs the GPU
    # tests that must catch it.
    mkdir -p "$OUT/mutants"
    for script in gpu_kernels gpu_gemv gpu_decode_attention; do
        OUT="$OUT/mutants/$script" STAGES=mutants bash "scripts/$script.sh" >"$OUT/mutants/$script.log" 2>&1 &
    done
    for job in $(jobs -p); do wait "$job" || RC=1; done
    grep -h "mutant " "$OUT"/mutants/*.log | tee -a "$LOG"
fi
if want cpu-tier; then
    # The README's test command on two cores (taskset), CUDA hidden: the tree before the re-layering
    # first, then this one, one after the other on an otherwise idle machine (CPU_TREES="old" or
    # "new" runs one of them).
    for tree in "old:.ab/tier-old" "new:."; do
        name=${tree%%:*}
        [[ " ${CPU_TREES:-old new} " == *" $name "* ]] || continue
        say "cpu-tier $name: pytest -n 2 in ${tree#*:}"
        (cd "${tree#*:}" && TIMEFORMAT="cpu-tier $name: real %R s, user %U s, sys %S s" && time (
            CUDA_VISIBLE_DEVICES= PYTHONPATH=. taskset -c 0,1 $PY -m pytest -n 2 -q -p no:cacheprovider \
                --junitxml="$OUT/cpu_$name.xml" >"$OUT/cpu_$name.log" 2>&1)) 2>&1 | tee -a "$LOG"
        grep -E "passed|failed" "$OUT/cpu_$name.log" | tail -2 | tee -a "$LOG"
    done
    if [ -f "$OUT/cpu_old.xml" ] && [ -f "$OUT/cpu_new.xml" ]; then
        $PY scripts/compare_test_times.py "$OUT/cpu_old.xml" "$OUT/cpu_new.xml" | tee -a "$LOG"
    fi
fi
say "done, exit $RC"
exit $RC
