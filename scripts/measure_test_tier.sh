#!/usr/bin/env bash
# The default tier (the README's `pytest -n auto`, CI=true, CUDA hidden) timed on two cores of its
# own per tree, several trees side by side in one go, so that before and after are measured on the
# same machine in one run:
#
#     OUT=DIR scripts/measure_test_tier.sh NAME=TREE [NAME=TREE ...]
#
# Each TREE is copied to a fresh folder (no __pycache__: a new clone's first run), then run under
# `taskset` on cores F+2k and F+2k+1 (k: the tree's place in the list, F: $FIRST_CORE, default 0) with `-n 2` (what `-n auto` gives
# on a 2-core machine), from source (PYTHONPATH=the copy). BYTECODE=0 sets PYTHONDONTWRITEBYTECODE=1
# for every run (each process then compiles and rewrites every module it imports).
# Writes $OUT/NAME.xml (JUnit, per-test times), $OUT/NAME.time ("wall_s user_s sys_s", children
# included) and $OUT/NAME.log; prints one line per tree. Needs at least 2 cores per tree.
# `scripts/contributing_figures.py tier` turns a NAME.xml and NAME.time into CONTRIBUTING.md's figures.
set -uo pipefail
OUT=${OUT:?set OUT to the results folder}
mkdir -p "$OUT"
[[ $# -ge 1 ]] || { echo "usage: OUT=DIR $0 NAME=TREE [NAME=TREE ...]" >&2; exit 2; }
PY=${PYTHON:-python3}
WORK=$(mktemp -d)

run_tree() {  # run_tree NAME TREE CORES
    local name=$1 tree=$2 cores=$3 copy="$WORK/$1"
    cp -r "$tree" "$copy"
    find "$copy" -name __pycache__ -prune -exec rm -rf {} +
    (
        cd "$copy" || exit 1
        export CI=true CUDA_VISIBLE_DEVICES="" PYTHONPATH="$copy" TIMEFORMAT="%R %U %S"
        if [[ ${BYTECODE:-1} == 0 ]]; then export PYTHONDONTWRITEBYTECODE=1; else unset PYTHONDONTWRITEBYTECODE; fi
        { time taskset -c "$cores" "$PY" -m pytest -n 2 -p no:cacheprovider -q \
            --junitxml="$OUT/$name.xml" >"$OUT/$name.log" 2>&1; } 2>"$OUT/$name.time"
    )
    echo "$name ($tree, cores $cores): $(tail -1 "$OUT/$name.log") | wall user sys: $(cat "$OUT/$name.time")"
}

k=${FIRST_CORE:-0}
for spec in "$@"; do
    run_tree "${spec%%=*}" "${spec#*=}" "$k,$((k + 1))" &
    k=$((k + 2))
done
wait
rm -rf "$WORK"
