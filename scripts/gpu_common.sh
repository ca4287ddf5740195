# Sourced by the scripts/gpu_*.sh scripts after they set NAME (their log prefix) and DEFAULT_STAGES:
# the results folder $OUT and its log.txt, PYTHONPATH on this tree, $PY, say (a line to stdout and
# the log), want STAGE (whether $STAGES lists it), RC (the exit status so far), gpu_environment.
set -u
OUT=${OUT:?set OUT to the results folder}
mkdir -p "$OUT"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
LOG="$OUT/log.txt"
: >"$LOG"
say() { echo "[$NAME $(date +%H:%M:%S)] $*" | tee -a "$LOG"; }
STAGES=${STAGES:-${DEFAULT_STAGES:-}}
want() { [[ " $STAGES " == *" $1 "* ]]; }
RC=0

gpu_environment() {  # the GPU, the versions and the commit, into the log
    say "environment"
    { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || true
      $PY -c 'import torch, sys; import triton; print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__, "gpu", torch.cuda.get_device_name(0))'
      git rev-parse --short HEAD 2>/dev/null || true; } 2>&1 | tee -a "$LOG"
}
