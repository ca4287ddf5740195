#!/usr/bin/env bash
# GPU benchmark run: copy bandwidth, side-by-side decode table, fast-path check, 2x gate, plot.
#
#   OUT=/some/dir scripts/gpu_bench.sh            # on a CUDA machine, from the repository root
#   OUT=/tmp/dry DRY_RUN=1 scripts/gpu_bench.sh   # the same stages on a CPU with tiny models
#   OUT=/some/dir STAGES="compare" MODELS="gemma-3-1b-it" scripts/gpu_bench.sh   # a part
#
# Needs torch (CUDA), transformers, pytest-benchmark, matplotlib; no network. Each stage runs on
# its own under a time limit, so a failing stage leaves the others' results. The whole run takes
# about 15 min on an H100 (torch.compile of the three fast steps is most of it); STAGES (any of
# fast_check compare gate plot) and MODELS split it. Writes at most 8 files into $OUT: log.txt
# results.md compare.json fast_check.json gate.json bench_llama.json latency_vs_position.png.
NAME=gpu_bench
DEFAULT_STAGES="fast_check compare gate plot"
# shellcheck source=scripts/gpu_common.sh
source "$(dirname "$0")/gpu_common.sh"
stage() {  # stage NAME SECONDS CMD...
    local name=$1 limit=$2; shift 2
    say "stage $name (limit ${limit}s): $*"
    local t0=$SECONDS
    timeout "$limit" "$@" 2>&1 | tee -a "$LOG"
    local rc=${PIPESTATUS[0]}
    say "stage $name: rc=$rc in $((SECONDS - t0))s"
    STATUS+="| $name | $rc | $((SECONDS - t0)) s |"$'\n'
}
STATUS=""

if [ "${DRY_RUN:-0}" = 1 ]; then
    DEV=(--device cpu); TINY=(--tiny); SMALL=(--prompt-len 16 --new-tokens 16 --repeats 1)
    BENCH_MODEL=tiny-llama; BENCH_SIZE=(--prompt-len 32 --new-tokens 32 --repeats 1)
    GATE_ENV=(INFER_REF_DEVICE=cpu INFER_REF_BENCH_MODEL=tiny-llama INFER_REF_BENCH_PROMPT=200 INFER_REF_BENCH_NEW=100)
    COMPILE=()  # torch.compile needs the CUDA graph path
    MODELS=${MODELS:-tiny-llama tiny-qwen3 tiny-gemma3_text}
else
    DEV=(--device cuda); TINY=(); SMALL=()
    BENCH_MODEL=llama-3.2-1b; BENCH_SIZE=(--prompt-len 512 --new-tokens 256 --repeats 2)
    GATE_ENV=(INFER_REF_DEVICE=cuda)
    COMPILE=(--compile)
    MODELS=${MODELS:-llama-3.2-1b qwen3-1.7b gemma-3-1b-it}
fi
read -r -a MODEL_ARGS <<<"$MODELS"

say "environment"
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv 2>/dev/null || true
  $PY -c 'import torch, transformers, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__, "gpu", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)'
  git rev-parse --short HEAD 2>/dev/null || true; } 2>&1 | tee -a "$LOG"

want fast_check && stage fast_check 90 $PY benchmarks/check_fast_decode.py "${DEV[@]}" "${TINY[@]}" --json "$OUT/fast_check.json"
want compare && stage compare 900 $PY benchmarks/decode_compare.py "${DEV[@]}" --models "${MODEL_ARGS[@]}" "${COMPILE[@]}" \
    "${SMALL[@]}" --json "$OUT/compare.json" --markdown "$OUT/compare_table.md"
want gate && stage gate 100 env "${GATE_ENV[@]}" $PY -m pytest -m benchmark tests/benchmarks -q -s -p no:cacheprovider \
    --benchmark-json "$OUT/gate.json"
want plot && stage plot 60 $PY benchmarks/bench_generation.py --model "$BENCH_MODEL" "${DEV[@]}" --compare --decode both \
    "${BENCH_SIZE[@]}" --json "$OUT/bench_llama.json" --plot "$OUT/latency_vs_position.png"

say "writing results.md"
$PY - "$OUT" "$STATUS" <<'PYEOF' 2>&1 | tee -a "$LOG"
import json, sys
from pathlib import Path
out, status = Path(sys.argv[1]), sys.argv[2]
md = ["# GPU benchmark results", "", "| stage | rc | time |", "|---|---|---|", status.rstrip(), ""]
for name, title in (("compare_table.md", "Decode throughput (eager, fast, compiled fast, transformers)"),):
    p = out / name
    if p.exists():
        md += [f"## {title}", "", p.read_text(), ""]
        p.unlink()  # folded in here (keeps $OUT within 8 files)
gate = out / "gate.json"
if gate.exists():
    d = json.loads(gate.read_text())
    md += ["## pytest-benchmark", "", f"machine: {d['machine_info'].get('gpu')}, torch {d['machine_info'].get('torch')}", ""]
    for b in d["benchmarks"]:
        md.append(f"- {b['name']}: median {b['stats']['median']:.3f} s; " + json.dumps(b["extra_info"]))
    md.append("")
fc = out / "fast_check.json"
if fc.exists():
    d = json.loads(fc.read_text())
    md += ["## Fast path vs eager (teacher-forced)", "", "| model | dtype | captured | free-running match | max gap | max top-5 diff | passed |", "|---|---|---|---|---|---|---|"]
    for r in d["results"]:
        md.append(f"| {r['model']} | {r.get('dtype')} | {r.get('captured')} | {r.get('free_running_exact_match')}/{r.get('new_tokens')} | "
                  f"{r.get('teacher_forced_max_gap_to_best_logprob', float('nan')):.3g} | {r.get('teacher_forced_max_topk_logprob_diff', float('nan')):.3g} | {r['passed']} {r.get('error', '')} |")
    md.append("")
bl = out / "bench_llama.json"
if bl.exists():
    d = json.loads(bl.read_text())
    md += ["## bench_generation (plot data)", ""] + [f"- {k}: {v:.2f}x" for k, v in d.get("speedup", {}).items()]
(out / "results.md").write_text("\n".join(md) + "\n")
print((out / "results.md").read_text())
PYEOF
ls -la "$OUT" | tee -a "$LOG"
say "done in ${SECONDS}s"
