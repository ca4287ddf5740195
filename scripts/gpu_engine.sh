#!/usr/bin/env bash
# The engine on a GPU: the bf16 teacher-forced checks (prefix caching on vs off with a shared
# 1024-token system prompt, every batch row vs the request alone) and the prefix-caching
# benchmark (prefill tokens computed and wall time, caching on vs off, side by side), in one go.
#
# Usage, from anywhere (no network needed):
#     scripts/gpu_engine.sh OUTDIR
# OUTDIR receives engine_llama-3.2-1b.json / .png (benchmark + checks), engine_gpu_tests.log.
# Environment: ENGINE_DEVICE (default cuda), ENGINE_MODEL (default llama-3.2-1b, random weights),
# ENGINE_REQUESTS (default 32), ENGINE_SYSTEM_TOKENS (default 1024). A CPU dry run of the flow:
#     ENGINE_DEVICE=cpu ENGINE_MODEL=tiny-llama ENGINE_REQUESTS=4 ENGINE_SYSTEM_TOKENS=256 scripts/gpu_engine.sh /tmp/dry
set -euo pipefail

OUT="${1:?usage: scripts/gpu_engine.sh OUTDIR}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TOKENIZERS_PARALLELISM=false
DEVICE="${ENGINE_DEVICE:-cuda}"
MODEL="${ENGINE_MODEL:-llama-3.2-1b}"
REQUESTS="${ENGINE_REQUESTS:-32}"
SYSTEM="${ENGINE_SYSTEM_TOKENS:-1024}"
T0=$SECONDS
say() { printf '\n[%4ds] == %s\n' "$((SECONDS - T0))" "$*"; }
status=0

say "GPU tests of the engine (bf16 teacher-forced: cold vs warm, batch row vs alone)"
python -m pytest -m gpu tests/integration/test_engine_gpu.py -v -p no:cacheprovider 2>&1 | tee "$OUT/engine_gpu_tests.log" || status=1

say "benchmark: $REQUESTS requests, shared $SYSTEM-token system prompt, prefix caching on vs off ($MODEL, bf16, $DEVICE)"
python benchmarks/bench_engine.py --model "$MODEL" --device "$DEVICE" --dtype bfloat16 \
  --requests "$REQUESTS" --system-tokens "$SYSTEM" --user-tokens 64 --new-tokens 32 --block-size 16 --max-batch 16 \
  --rounds 3 --check --out "$OUT/engine_$MODEL.json" --plot "$OUT/engine_$MODEL.png" 2>&1 | tee "$OUT/engine_bench.log" || status=1

say "done (exit $status); results in $OUT"
exit "$status"
