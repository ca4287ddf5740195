#!/usr/bin/env bash
# A/B of a decode-speed change: the compiled fast step at one or more contexts, timed from several source
# trees in one run on one GPU (the same machine, copy bandwidth and clocks for every tree), in
# interleaved rounds. Each tree is a folder holding infer_ref/ and benchmarks/ of one version:
#
#   git archive <commit> infer_ref benchmarks | (mkdir -p ab_old && tar -x -C ab_old)
#   OUT=/some/dir TREES="ab_old ." scripts/gpu_ab.sh                   # from the repository root
#   OUT=/some/dir TREES="ab_old ." MODELS="gemma-3-1b-it" ROUNDS=2 CONTEXT=128 scripts/gpu_ab.sh
#   OUT=/some/dir TREES="old=ab_old new=." CONTEXT="128 4096" scripts/gpu_ab.sh     # several contexts
#
# A tree is named by its folder, or NAME=FOLDER to set the label. Per tree and round it runs
# `decode_compare.py --contexts CONTEXT --caches static --compile --fast-only --rounds 1` (one
# process: a fresh torch.compile), keeps its log, and prints one line per (model, tree, round) with
# tok/s and % of copy bandwidth (CONTEXT may list several: each line names its context). Trees
# whose run would start past BUDGET_S are skipped (listed).
set -u
OUT=${OUT:?set OUT to the results folder}
TREES=${TREES:?set TREES to the source trees to compare}
MODELS=${MODELS:-llama-3.2-1b qwen3-1.7b gemma-3-1b-it}
CONTEXT=${CONTEXT:-128}
ROUNDS=${ROUNDS:-1}
BUDGET_S=${BUDGET_S:-540}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
SUMMARY="$OUT/ab.txt"
: >"$SUMMARY"
START=$(date +%s)
say() { echo "[gpu_ab $(date +%H:%M:%S)] $*" | tee -a "$SUMMARY"; }
say "trees: $TREES; models: $MODELS; context $CONTEXT; rounds $ROUNDS"
for round in $(seq 1 "$ROUNDS"); do
    for spec in $TREES; do
        name=${spec%%=*}
        tree=${spec#*=}
        [[ "$spec" == *=* ]] || name=$(basename "$(cd "$tree" && pwd)")
        if (($(date +%s) - START > BUDGET_S)); then
            say "skipped: $name round $round (past BUDGET_S=$BUDGET_S)"
            continue
        fi
        log="$OUT/${name}_r${round}.log"
        # shellcheck disable=SC2086  # MODELS and CONTEXT are lists
        (cd "$tree" && PYTHONPATH=. PYTHONUNBUFFERED=1 $PY benchmarks/decode_compare.py --device cuda \
            --models $MODELS --contexts $CONTEXT --caches static --compile --fast-only --rounds 1) \
            >"$log" 2>&1 || say "$name round $round: exit $? (see $log)"
        grep "compiled" "$log" | grep "tok/s" | sed "s/^/[$name r$round] /" | tee -a "$SUMMARY"
    done
done
say "done in $(($(date +%s) - START)) s"
