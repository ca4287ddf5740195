#!/usr/bin/env bash
# Every GPU check of the low-precision verdict (docs/low-precision.md, "GPU engines"), in two parts
# that fit one device call each:
#   gpu    the engine tier on the GPU against infer_ref's Engine (its fast path: which kernels ran is
#          counted by scripts/fast_path_in_engine.py) and transformers (SDPA and eager attention,
#          FlashAttention 2 where installed) in bfloat16, float16 and float32, each run's JUnit XML
#          and report JSON for docs/engine-results; and the SDPA float32 repro with each backend pinned
#          (scripts/repro_sdpa_cuda_float32.py);
#   power  on the host's cores with CUDA hidden, the power table of every planted bug in
#          float32/bfloat16/float16.
#
#   OUT=dir PARTS="gpu power" bash scripts/gpu_low_precision.sh   (from the repository root, PYTHONPATH=.)
#   DTYPES="bfloat16 float16" SDPA_REPRO=0 ...   the gpu part in those dtypes only, without the SDPA repro
#   TIER_LIMIT=500 ...                            each tier run stopped after that many seconds (exit 124)
#
# Each part packs its results into $OUT/<part>-results.tgz (a device run returns few files).
set -uo pipefail
OUT=${OUT:?set OUT to the folder for the results}
RESULTS=$(mktemp -d)
PARTS=${PARTS:-gpu power}
JOBS=${JOBS:-$(( $(nproc) - 2 ))}
export PYTHONPATH=${PYTHONPATH:-.}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
python -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a "$OUT/gpu.txt"

tier() {  # tier NAME ENGINE DTYPE [OPTION...]: one tier run on the GPU
    local name=$1 engine=$2 dtype=$3; shift 3
    local start=$SECONDS
    timeout "${TIER_LIMIT:-0}" python -m pytest -p no:cacheprovider -q -n 0 -rfE --pyargs infer_ref.conformance.engines.tests \
        --ir-engine="$engine" --ir-engine-dtype="$dtype" "$@" \
        --junitxml="$RESULTS/$name.xml" --ir-report="$RESULTS/$name.json" >"$RESULTS/$name.log" 2>&1
    echo "$name: exit $? in $((SECONDS - start)) s; $(tail -1 "$RESULTS/$name.log")"
}
python -c "from infer_ref.conformance.engines.workloads.folders import default_model_dirs; default_model_dirs()"  # written once, before the parallel runs

gpu_part() {
    python scripts/fast_path_in_engine.py --device cuda --dtype bfloat16 | tee "$RESULTS/fast-path.json"
    if [[ ${SDPA_REPRO:-1} == 1 ]]; then
        python scripts/repro_sdpa_cuda_float32.py --device cuda --length 5 31 32 33 63 64 65 95 96 97 >"$RESULTS/sdpa-repro.json" 2>"$RESULTS/sdpa-repro.log" &
    fi
    local attentions="sdpa eager" dtype attention
    python -c "import flash_attn" 2>/dev/null && attentions="$attentions flash_attention_2"
    for dtype in ${DTYPES:-bfloat16 float16 float32}; do
        tier "infer_ref-cuda-$dtype" infer_ref "$dtype" --ir-engine-option=device=cuda &
        for attention in $attentions; do
            tier "transformers-cuda-$attention-$dtype" transformers "$dtype" --ir-engine-option=device=cuda \
                --ir-engine-option="attn_implementation=$attention" &
        done
    done
    wait
    [[ -f $RESULTS/sdpa-repro.json ]] && echo "sdpa repro: $(tr -d ' \n' <"$RESULTS/sdpa-repro.json" | head -c 2000)"
}

power_part() {
    cp docs/low-precision.md "$RESULTS/low-precision.md"
    local start=$SECONDS
    CUDA_VISIBLE_DEVICES="" python -m infer_ref.conformance.engines.power --jobs "$JOBS" --json "$RESULTS/power.json" \
        --doc "$RESULTS/low-precision.md" >"$RESULTS/power.log" 2>&1
    echo "power table: exit $? in $((SECONDS - start)) s on $JOBS processes"
}

for part in $PARTS; do
    rm -rf "$RESULTS" && mkdir -p "$RESULTS"
    cp "$OUT/gpu.txt" "$RESULTS/gpu.txt"
    "${part}_part"
    tar czf "$OUT/$part-results.tgz" -C "$RESULTS" .
done
