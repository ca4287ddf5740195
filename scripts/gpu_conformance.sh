#!/usr/bin/env bash
# The conformance kit on CUDA: bf16 conformance of infer_ref and of the transformers adapters, and
# the GPU tier with 1 and 2 pytest-xdist workers (each worker takes its own GPU) timed side by side.
#
# Usage, from anywhere (no network needed; torch with CUDA, transformers, pytest-xdist installed):
#     scripts/gpu_conformance.sh OUT_DIR
# Writes under OUT_DIR, after every stage (a partial run still leaves results):
#     conformance-<impl>.md / .log          per implementation, --device cuda --dtype bfloat16
#     tier-n1.log, tier-n2.log                 the GPU tier (pytest -m gpu) with -n 1 and -n 2
#     kit-n1.log, kit-n2.log                   infer_ref's bf16 conformance with -n 1 and -n 2
#     summary.md                               exit codes and wall times of every stage
# Every stage runs whatever the previous ones did; the script's exit status is 0 when it could run
# them all (each stage's own status is in summary.md; summary.md is appended to, so several calls
# with different STAGES / IMPLS can share one OUT_DIR).
# Environment (to split the work over several shorter calls):
#     STAGES         "conformance tier" (default both): (a) and/or (b) below
#     IMPLS          implementations for (a), default "infer_ref dynamic-sdpa static-sdpa dynamic-eager static-eager"
#     GOLDEN_IMPLS   which of them also verify the CUDA golden files (test_golden; the real-shape
#                    models take minutes each), default "infer_ref"
#     KIT_WORKERS    xdist workers for (a), default 4 (they share the GPUs round-robin; the
#                    transformers float64 oracle runs on the CPU)
#     STAGE_TIMEOUT  seconds per stage, default 1800
set -uo pipefail

if [[ $# -lt 1 ]]; then
  echo "usage: $0 OUT_DIR" >&2
  exit 2
fi
mkdir -p "$1"
OUT="$(cd "$1" && pwd)"
cd "$(dirname "$0")/.."
ROOT="$PWD"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
PY="${PYTHON:-python}"
LIMIT="${STAGE_TIMEOUT:-1800}"   # seconds per stage
SUMMARY="$OUT/summary.md"
STAGES="${STAGES:-conformance tier}"
IMPLS="${IMPLS:-infer_ref dynamic-sdpa static-sdpa dynamic-eager static-eager}"
GOLDEN_IMPLS="${GOLDEN_IMPLS:-infer_ref}"
KIT_WORKERS="${KIT_WORKERS:-4}"
GPUS="$("$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)' 2>/dev/null || echo 0)"
XF="$ROOT/infer_ref/conformance/xfails"
HF=infer_ref.conformance.adapters.transformers

{
  echo "# GPU conformance run"
  echo
  echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC'), host $(hostname)"
  echo "- GPUs visible to torch: $GPUS"
  nvidia-smi -L 2>/dev/null | sed 's/^/  - /'
  "$PY" -c 'import platform, torch, transformers; print(f"- python {platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}")' 2>&1
  echo
  echo "| stage | exit | wall s | log |"
  echo "|---|---|---|---|"
} >> "$SUMMARY"

# stage NAME LOG COMMAND...: run with a time limit, append exit status and wall time to the summary.
stage() {
  local name="$1" log="$2"
  shift 2
  echo ">>> $name: $*" | tee "$OUT/$log"
  local t0=$SECONDS
  ( cd "$WORKDIR" && timeout "$LIMIT" "$@" ) >> "$OUT/$log" 2>&1
  local rc=$?
  local wall=$((SECONDS - t0))
  echo "| $name | $rc | $wall | $log |" >> "$SUMMARY"
  echo "<<< $name: exit $rc in ${wall}s"
  return 0
}

if [[ "$GPUS" -lt 1 ]]; then
  echo "| (no CUDA device: nothing run) | - | - | - |" >> "$SUMMARY"
  echo "no CUDA device visible to torch" >&2
  exit 1
fi

has() { [[ " $1 " == *" $2 "* ]]; }

# (a) bf16 CUDA conformance, from a directory outside the checkout (as an engine team runs it).
WORKDIR="$(mktemp -d)"
conformance() {  # conformance NAME IMPL [extra args...]
  local name="$1" impl="$2"
  shift 2
  has "$IMPLS" "$name" || return 0
  local only=()
  has "$GOLDEN_IMPLS" "$name" || only=(-k "not test_golden")
  stage "conformance $name (cuda bf16)" "conformance-$name.log" \
    "$PY" -m infer_ref.cli conformance --impl "$impl" --device cuda --dtype bfloat16 --profile ci \
    -n "$KIT_WORKERS" --report "$OUT/conformance-$name.md" ${only[@]+"${only[@]}"} "$@"
}
if has "$STAGES" conformance; then
  conformance infer_ref infer_ref.conformance.adapters.reference:INFER_REF
  # The cache-level xfails are device-independent; the eager files were measured in float64 (eager's
  # float32 softmax), so bf16 runs of eager attention use only the cache files.
  conformance dynamic-sdpa "$HF:DYNAMIC_SDPA" --xfails "$XF/transformers-dynamic.txt"
  conformance static-sdpa "$HF:STATIC_SDPA" --xfails "$XF/transformers-static.txt"
  conformance dynamic-eager "$HF:DYNAMIC_EAGER" --xfails "$XF/transformers-dynamic.txt"
  conformance static-eager "$HF:STATIC_EAGER" --xfails "$XF/transformers-static.txt"
fi

# (b) the GPU tier and the kit's bf16 run with 1 and 2 workers: each xdist worker takes its own GPU.
WORKDIR="$ROOT"
has "$STAGES" tier || { cat "$SUMMARY"; exit 0; }
for n in 1 2; do
  if [[ "$n" -gt "$GPUS" ]]; then
    echo "| GPU tier -n $n | skipped: $GPUS GPU(s) | - | - |" >> "$SUMMARY"
    continue
  fi
  stage "GPU tier (pytest -m gpu) -n $n" "tier-n$n.log" "$PY" -m pytest -m gpu -n "$n" -p no:cacheprovider -q
  stage "infer_ref conformance cuda bf16 -n $n (no goldens)" "kit-n$n.log" \
    "$PY" -m infer_ref.cli conformance --device cuda --dtype bfloat16 --profile ci -n "$n" -k "not test_golden"
done

{
  echo
  echo "Each xdist worker gw<i> uses cuda:<i mod $GPUS> (infer_ref.conformance.plugin.worker_device);"
  echo "compare the wall times of the -n 1 and -n 2 rows."
} >> "$SUMMARY"
cat "$SUMMARY"
exit 0
