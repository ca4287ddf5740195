"""A Hugging Face folder as a CTranslate2 model directory, written by CTranslate2's own converter.

CTranslate2 reads no Hugging Face folder: users run ``ct2-transformers-converter --model FOLDER
--output_dir OUT --quantization TYPE`` (installed with the ``ctranslate2`` package, loading the
checkpoint through transformers), so that converter is part of what the tier judges: a config.json
field it ignores is a wrong answer of CTranslate2's. It is never replaced by a converter of ours.

Converted directories are cached by the folder's content, the quantization and the ctranslate2
version (``$INFER_REF_CT2_CACHE``, default ``~/.cache/infer_ref/ct2``): a checkpoint is converted once.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from infer_ref.conformance.engines.adapters.conversion_cache import cache_dir, content_digest
from infer_ref.conformance.engines.adapters.engine_venv import installed_version
from infer_ref.conformance.engines.adapters.subprocess_bridge import EngineNotInstalled, EngineWorkerError
from infer_ref.conformance.interface.contract import Unsupported
from infer_ref.errors import DataError

CACHE_ENV = "INFER_REF_CT2_CACHE"
CONVERTER = "ct2-transformers-converter"
# The tier's dtypes as the converter's --quantization (float64: CTranslate2 has no such compute type).
QUANTIZATIONS = {"float32": "float32", "float16": "float16", "bfloat16": "bfloat16"}
# The converter's words for an architecture it has no loader for (ctranslate2/converters/transformers.py).
REFUSALS = ("No conversion is registered", "not supported", "NotImplementedError")


@dataclass(frozen=True)
class Converted:
    """A converted model directory and how it came to be (``seconds`` is 0 for a cache hit)."""

    path: Path
    quantization: str
    ctranslate2_version: str
    seconds: float


def converter_path(python: str) -> Path:
    """The converter's console script beside ``python`` (in the same venv's bin/)."""
    return Path(python).parent / CONVERTER


def ctranslate2_version(python: str, env: dict[str, str], not_installed: Callable[[str], str]) -> str:
    """The ctranslate2 version ``python`` imports; :class:`EngineNotInstalled` (``not_installed``'s
    message for the reason) when it has none or the converter is not beside it."""
    try:
        version = installed_version(python, "ctranslate2", env, timeout=120)
    except OSError as err:
        raise EngineNotInstalled(not_installed(f"cannot run it ({err.strerror or err})")) from None
    except subprocess.TimeoutExpired:
        raise EngineNotInstalled(not_installed("it did not answer within 120 s")) from None
    if version is None:
        raise EngineNotInstalled(not_installed("it has no ctranslate2 package"))
    if not converter_path(python).is_file():
        raise EngineNotInstalled(not_installed(f"no {CONVERTER} beside it ({converter_path(python)})"))
    return version


def convert(
    model_dir: Path,
    dtype: str,
    *,
    python: str,
    version: str,
    env: dict[str, str],
    cache: str | os.PathLike[str] | None = None,
    timeout: float = 900.0,
) -> Converted:
    """``model_dir`` as a CTranslate2 model directory of ``dtype`` weights (cached)."""
    if dtype not in QUANTIZATIONS:
        raise Unsupported(
            f"CTranslate2 has no {dtype} compute type (its converter writes {', '.join(QUANTIZATIONS)})"
        )
    quantization = QUANTIZATIONS[dtype]
    folder = cache_dir(cache, CACHE_ENV, "ct2")
    digest = content_digest(model_dir, f"{quantization}\0ctranslate2 {version}")
    target = folder / f"{model_dir.name}-{digest}-{quantization}"
    if (target / "model.bin").is_file():
        return Converted(target, quantization, version, 0.0)
    folder.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(dir=folder, prefix=".converting-") as work:
        partial = Path(work) / "model"
        log = Path(work) / "convert.log"
        argv = [
            os.fspath(converter_path(python)),
            "--model",
            os.fspath(model_dir.resolve()),
            "--output_dir",
            os.fspath(partial),
            "--quantization",
            quantization,
        ]
        status = _run_logged(argv, env, timeout, log)
        if status != 0 or not (partial / "model.bin").is_file():
            raise _conversion_error(model_dir, quantization, status, log.read_text(errors="replace"))
        shutil.rmtree(target, ignore_errors=True)  # a directory left half-written by a crash elsewhere
        os.replace(partial, target)  # whole or not at all
    return Converted(target, quantization, version, time.monotonic() - start)


def _run_logged(argv: list[str], env: dict[str, str], timeout: float, log: Path) -> int | None:
    """The converter's exit status (None: timed out), its output in ``log``."""
    with open(log, "wb") as out:
        try:
            return subprocess.run(
                argv, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=timeout, check=False
            ).returncode
        except subprocess.TimeoutExpired:
            return None
        except OSError as err:
            raise EngineWorkerError(
                f"CTranslate2's converter: cannot run {argv[0]}: {err.strerror or err}"
            ) from None


def _conversion_error(model_dir: Path, quantization: str, status: int | None, log: str) -> Exception:
    """The converter's refusal in one line: its last error line (a refused architecture is "not
    supported")."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    last = next((line for line in reversed(lines) if "Error" in line), lines[-1] if lines else "(no output)")
    what = "timed out" if status is None else f"exited with status {status}"
    message = f"CTranslate2's converter {what} on {model_dir} (--quantization {quantization}): {last[:300]}"
    if any(refusal in last for refusal in REFUSALS):
        return Unsupported(message)
    return DataError(message)
