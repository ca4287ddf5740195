#!/usr/bin/env bash
# llama.cpp (through llama-cpp-python, built from source) in a venv of its own, for the engine tier,
# with what llama.cpp's own checkpoint converter needs. Never in the project's environment.
# Idempotent: a venv that already holds everything is left as it is.
#
#   scripts/install_llamacpp.sh [VENV_DIR]    # default .venv-llamacpp; PYTHON picks the base interpreter
#   export INFER_REF_LLAMACPP_PYTHON=VENV_DIR/bin/python
#   export INFER_REF_LLAMACPP_SOURCE=VENV_DIR/src/llama.cpp     # (found there without it too)
#
# The converter (convert_hf_to_gguf.py) is not in the wheel: it ships in the sdist, under
# vendor/llama.cpp, beside its own gguf-py; the sdist is unpacked into VENV/src and the gguf package
# installed from that very tree, so converter and gguf versions match. The converter's requirements
# pin transformers 4.57.6 and numpy ~2.2.6; torch is the CPU build (torch 2.13.0+cpu from the
# configured wheel source), installed first so that nothing later pulls a CUDA one.
#
# The built wheel is kept under $INFER_REF_WHEEL_CACHE (default ~/.cache/infer_ref/wheels), named by
# a digest of what decides the build: the sdist's bytes, the interpreter, the compiler, the CPU's
# flags (llama.cpp builds for the native CPU) and CMAKE_ARGS. A new venv on the same machine then
# installs in seconds instead of rebuilding (10-20 minutes on 2 cores).
set -euo pipefail
VENV=${1:-.venv-llamacpp}
BASE_PYTHON=${PYTHON:-python3}
LLAMA_CPP_PYTHON=0.3.36
TORCH=2.13.0
TRANSFORMERS=4.57.6
SOURCE="$VENV/src/llama.cpp"
start=$SECONDS

step() {  # step NAME COMMAND...: runs COMMAND, prints how long it took
    local name=$1 t0=$SECONDS
    shift
    "$@"
    echo "install_llamacpp.sh: $name took $((SECONDS - t0)) s"
}

installed() {
    [ -x "$VENV/bin/python" ] && [ -f "$SOURCE/convert_hf_to_gguf.py" ] \
        && "$VENV/bin/python" - "$LLAMA_CPP_PYTHON" "$TORCH" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version

llama_cpp_python, torch = sys.argv[1:]
assert version("llama_cpp_python") == llama_cpp_python
assert version("torch").split("+")[0] == torch and "+cpu" in version("torch")
import gguf, llama_cpp, llama_cpp.server, sentencepiece, safetensors, transformers  # noqa: F401,E401
PY
}

unpack_sources() {
    local downloads="$VENV/src/downloads"
    mkdir -p "$downloads"
    [ -f "$downloads/llama_cpp_python-$LLAMA_CPP_PYTHON.tar.gz" ] \
        || "$VENV/bin/python" -m pip --quiet download --no-deps --no-binary :all: \
            "llama-cpp-python==$LLAMA_CPP_PYTHON" -d "$downloads"
    tar -xzf "$downloads/llama_cpp_python-$LLAMA_CPP_PYTHON.tar.gz" -C "$VENV/src"
    rm -rf "$SOURCE"
    ln -s "llama_cpp_python-$LLAMA_CPP_PYTHON/vendor/llama.cpp" "$SOURCE"
}

if installed; then
    echo "llama-cpp-python $LLAMA_CPP_PYTHON already in $VENV ($((SECONDS - start)) s):" \
        "export INFER_REF_LLAMACPP_PYTHON=$VENV/bin/python INFER_REF_LLAMACPP_SOURCE=$SOURCE"
    exit 0
fi
"$BASE_PYTHON" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --quiet)
step "the sdist (converter sources)" unpack_sources
step "torch $TORCH (CPU)" "${PIP[@]}" install "torch==$TORCH" "numpy~=2.2.6"
"$VENV/bin/python" -c "import torch, sys; sys.exit('+cpu' not in torch.__version__)" \
    || { echo "install_llamacpp.sh: torch in $VENV is not the CPU build" >&2; exit 1; }
step "converter requirements" "${PIP[@]}" install "transformers==$TRANSFORMERS" "numpy~=2.2.6" \
    safetensors "sentencepiece>=0.1.98,<0.3.0" "protobuf>=4.21.0,<5.0.0"
step "gguf from the sdist's gguf-py" "${PIP[@]}" install "$SOURCE/gguf-py"
# The build: llama.cpp's C++ compiled by scikit-build-core into a wheel (the long part;
# CMAKE_BUILD_PARALLEL_LEVEL bounds the jobs), skipped when the wheel cache has this very build.
SDIST=$(realpath "$VENV/src/downloads/llama_cpp_python-$LLAMA_CPP_PYTHON.tar.gz")
build_key() {
    { sha256sum "$SDIST" | cut -d' ' -f1
      "$VENV/bin/python" -c 'import platform, sys; print(sys.version, platform.machine())'
      "${CC:-cc}" --version 2>/dev/null | head -1
      grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true
      echo "CMAKE_ARGS=${CMAKE_ARGS:-}"; } | sha256sum | cut -c1-16
}
WHEELS="${INFER_REF_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/infer_ref/wheels}/llama-cpp-python-$LLAMA_CPP_PYTHON-$(build_key)"
build_wheel() {
    rm -rf "$WHEELS.partial" && mkdir -p "$WHEELS.partial"
    env CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" "${PIP[@]}" wheel --no-deps \
        -w "$WHEELS.partial" "$SDIST"
    rm -rf "$WHEELS" && mv "$WHEELS.partial" "$WHEELS"  # complete or absent, never half-written
}
if compgen -G "$WHEELS/*.whl" >/dev/null; then
    echo "install_llamacpp.sh: the build is cached: $WHEELS"
else
    step "llama-cpp-python $LLAMA_CPP_PYTHON (build from source)" build_wheel
fi
WHEEL=$(compgen -G "$WHEELS/*.whl" | head -1)
step "llama-cpp-python $LLAMA_CPP_PYTHON with its server's requirements" "${PIP[@]}" install \
    "llama-cpp-python[server] @ file://$WHEEL"
installed || { echo "install_llamacpp.sh: $VENV does not import llama_cpp, llama_cpp.server, gguf and the converter's requirements after installing (run $VENV/bin/python -c 'import llama_cpp.server, gguf' to see why)" >&2; exit 1; }
echo "llama-cpp-python $LLAMA_CPP_PYTHON installed in $VENV in $((SECONDS - start)) s:" \
    "export INFER_REF_LLAMACPP_PYTHON=$VENV/bin/python INFER_REF_LLAMACPP_SOURCE=$SOURCE"
