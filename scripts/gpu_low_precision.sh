#!/usr/bin/env bash
# Every GPU check of the low-precision verdict in one go (docs/low-precision.md, "GPU engines"):
# the engine tier on the GPU against infer_ref's Engine and transformers (SDPA and eager attention,
# FlashAttention 2 where installed) in bfloat16 and float16 (float32 too, the exact tier), each
# run's JUnit XML and report JSON written under $OUT for docs/engine-results; then, on the host's
# cores with CUDA hidden, the power table of every planted bug in float32/bfloat16/float16.
#
#   OUT=dir bash scripts/gpu_low_precision.sh        (from the repository root, PYTHONPATH=.)
#
# The power table runs in the background beside the GPU runs (they use one core each); everything
# is packed into $OUT/low-precision-results.tgz (a device run returns few files).
set -uo pipefail
OUT=${OUT:?set OUT to the folder for the results}
RESULTS=$(mktemp -d)
JOBS=${JOBS:-$(( $(nproc) - 6 ))}
export PYTHONPATH=${PYTHONPATH:-.}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$RESULTS/gpu.txt"
python -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a "$RESULTS/gpu.txt"

tier() {  # tier NAME ENGINE DTYPE [OPTION...]: one tier run on the GPU
    local name=$1 engine=$2 dtype=$3; shift 3
    local start=$SECONDS
    python -m pytest -p no:cacheprovider -q -n 0 -rfE --pyargs infer_ref.conformance.engines.tests \
        --ir-engine="$engine" --ir-engine-dtype="$dtype" "$@" \
        --junitxml="$RESULTS/$name.xml" --ir-report="$RESULTS/$name.json" >"$RESULTS/$name.log" 2>&1
    echo "$name: exit $? in $((SECONDS - start)) s; $(tail -1 "$RESULTS/$name.log")"
}
python -c "from infer_ref.conformance.engines.session import default_model_dirs; default_model_dirs()"  # written once, before the parallel runs
cp docs/low-precision.md "$RESULTS/low-precision.md"
(start=$SECONDS
 CUDA_VISIBLE_DEVICES="" python -m infer_ref.conformance.engines.power --jobs "$JOBS" --json "$RESULTS/power.json" \
     --doc "$RESULTS/low-precision.md" >"$RESULTS/power.log" 2>&1
 echo "power table: exit $? in $((SECONDS - start)) s on $JOBS processes") &

attentions="sdpa eager"
python -c "import flash_attn" 2>/dev/null && attentions="$attentions flash_attention_2"
for dtype in bfloat16 float16 float32; do
    (tier "infer_ref-cuda-$dtype" infer_ref "$dtype" --ir-engine-option=device=cuda
     for attention in $attentions; do
         tier "transformers-cuda-$attention-$dtype" transformers "$dtype" --ir-engine-option=device=cuda \
             --ir-engine-option="attn_implementation=$attention"
     done) &
done
wait  # the GPU runs and the power table alike
tar czf "$OUT/low-precision-results.tgz" -C "$RESULTS" .
