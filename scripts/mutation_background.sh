#!/usr/bin/env bash
# The full mutation run (`scripts/mutation.py run --whole`) on a machine with many cores, where one call
# of a command may last less than the run: the first call starts it detached (setsid), every call then
# waits up to WAIT_S seconds, printing mutmut's progress, and once the run has ended writes its figures:
#
#     OUT=DIR JOBS=30 WAIT_S=560 scripts/mutation_background.sh     # again until it prints "done"
#
# CUDA is hidden, so the same CPU tests run as on a machine without a GPU. Writes $OUT/mutation.log,
# $OUT/figures.md, $OUT/figures.json, $OUT/survivors.txt and $OUT/meta.tgz (mutmut's per-file results,
# for `scripts/mutation.py figures` elsewhere) once done.
set -uo pipefail
OUT=${OUT:?set OUT to the results folder}
STATE=${STATE:-/tmp/infer_ref_mutation}
mkdir -p "$OUT" "$STATE"
if [[ ! -e $STATE/started ]]; then
    date +%s >"$STATE/started"
    CUDA_VISIBLE_DEVICES="" PYTHONUNBUFFERED=1 setsid nohup bash -c \
        "python3 scripts/mutation.py run --whole --jobs ${JOBS:-30} >'$STATE/log' 2>&1; echo \$? >'$STATE/rc'" \
        </dev/null >/dev/null 2>&1 &
fi
deadline=$(( $(date +%s) + ${WAIT_S:-560} ))
while [[ ! -e $STATE/rc && $(date +%s) -lt $deadline ]]; do
    sleep 20
    echo "$(( $(date +%s) - $(cat "$STATE/started") )) s: $(tail -c 300 "$STATE/log" | tr '\r' '\n' | grep -v '^\s*$' | tail -1)"
done
cp "$STATE/log" "$OUT/mutation.log"
[[ -e $STATE/rc ]] || { echo "still running"; exit 0; }
echo "done: mutmut run exited $(cat "$STATE/rc") after $(( $(date +%s) - $(cat "$STATE/started") )) s"
python3 scripts/mutation.py figures --json "$OUT/figures.json" | tee "$OUT/figures.md"
python3 scripts/mutation.py survivors >"$OUT/survivors.txt"
find mutants -name '*.py.meta' -print0 | tar czf "$OUT/meta.tgz" --null -T -
