"""A Hugging Face folder as an ONNX Runtime GenAI model, written by the engine's own model builder, cached.

ONNX Runtime GenAI reads no Hugging Face folder: users run its model builder
(``python -m onnxruntime_genai.models.builder -i FOLDER -o OUT -p fp32 -e cpu``), which writes the
decoder as an ONNX graph of its own making plus a ``genai_config.json``. So the builder is part of
what the tier judges (a config.json field it ignores is a wrong answer of the engine's); it runs
exactly as its command line, in the engine's venv, and is never replaced by an exporter of ours.

Built folders are cached by the checkpoint's content, the precision and the builder's version
(``$INFER_REF_ORTGENAI_CACHE``, default ``~/.cache/infer_ref/ortgenai``): a checkpoint is built once.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from infer_ref.conformance.engines.adapters import conversion_cache
from infer_ref.conformance.engines.adapters.engine_venv import installed_version
from infer_ref.conformance.engines.adapters.subprocess_bridge import EngineNotInstalled, EngineWorkerError
from infer_ref.conformance.interface.contract import Unsupported
from infer_ref.errors import DataError

CACHE_ENV = "INFER_REF_ORTGENAI_CACHE"
BUILDER = "onnxruntime_genai.models.builder"
# The tier's dtypes as the builder's --precision (float64 is no precision it writes).
PRECISIONS = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
# Where the builder says it refuses an architecture or one of its settings.
REFUSALS = ("is not currently supported", "NotImplementedError")
# Builds that failed in this process, by target folder: the tier starts an engine twice per
# checkpoint (plain, stressed), and a build that failed once fails the same way again.
_FAILED: dict[str, Exception] = {}


@dataclass(frozen=True)
class Built:
    """A folder the builder wrote (model.onnx, genai_config.json, tokenizer) and how long it took
    (``seconds`` is 0 for a cache hit)."""

    path: Path
    precision: str
    builder_version: str
    seconds: float


def builder_version(python: str, env: dict[str, str]) -> str:
    """onnxruntime-genai's version in ``python``'s environment (without importing it: that takes seconds)."""
    try:
        version = installed_version(python, "onnxruntime-genai", env)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise EngineWorkerError(f"ONNX Runtime GenAI's builder: cannot run {python}: {err}") from None
    if version is None:
        raise EngineNotInstalled(f"onnxruntime-genai is not installed in {python}")
    return version


def content_digest(model_dir: Path, precision: str, version: str) -> str:
    """What decides the builder's output: the folder's files, the precision, the builder's version."""
    return conversion_cache.content_digest(model_dir, f"{precision}\0{version}")


def cache_dir(root: str | os.PathLike[str] | None = None) -> Path:
    return conversion_cache.cache_dir(root, CACHE_ENV, "ortgenai")


def build(
    model_dir: Path,
    dtype: str,
    *,
    python: str,
    env: dict[str, str],
    cache: str | os.PathLike[str] | None = None,
    timeout: float = 900.0,
) -> Built:
    """``model_dir`` as an ONNX Runtime GenAI folder of ``dtype`` (cached), written by its model builder."""
    if dtype not in PRECISIONS:
        raise Unsupported(
            f"ONNX Runtime GenAI's model builder writes no {dtype} model (it writes {', '.join(PRECISIONS)})"
        )
    precision = PRECISIONS[dtype]
    version = builder_version(python, env)
    folder = cache_dir(cache)
    target = folder / f"{model_dir.name}-{content_digest(model_dir, precision, version)}-{precision}"
    if (target / "genai_config.json").is_file():
        return Built(target, precision, version, 0.0)
    if os.fspath(target) in _FAILED:
        raise _FAILED[os.fspath(target)]
    folder.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(dir=folder, prefix=".building-") as work:
        partial = Path(work) / "model"
        log = Path(work) / "build.log"
        argv = [
            python,
            "-m",
            BUILDER,
            "-i",
            os.fspath(model_dir.resolve()),
            "-o",
            os.fspath(partial),
            "-p",
            precision,
            "-e",
            "cpu",
            "-c",
            os.fspath(Path(work) / "hf-cache"),
        ]
        with open(log, "wb") as out:
            try:
                status = subprocess.run(
                    argv,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=work,
                    timeout=timeout,
                    check=False,
                ).returncode
            except subprocess.TimeoutExpired:
                status = None
        if status != 0 or not (partial / "genai_config.json").is_file():
            _FAILED[os.fspath(target)] = build_error(
                model_dir, precision, status, log.read_text(errors="replace")
            )
            raise _FAILED[os.fspath(target)]
        shutil.rmtree(target, ignore_errors=True)
        os.replace(partial, target)  # whole or not at all: a crash leaves no half-built folder cached
    return Built(target, precision, version, time.monotonic() - start)


def build_error(model_dir: Path, precision: str, status: int | None, log: str) -> Exception:
    """The builder's failure in one line, its last error line: a refusal is "not supported"."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    last = next(
        (line for line in reversed(lines) if "Error" in line or "Exception" in line),
        lines[-1] if lines else "",
    )
    what = "timed out" if status is None else f"exited with status {status}"
    message = (
        f"ONNX Runtime GenAI's model builder {what} on {model_dir} (-p {precision} -e cpu): {last[:300]}"
    )
    if any(refusal in last for refusal in REFUSALS):
        return Unsupported(message)
    return DataError(message)
