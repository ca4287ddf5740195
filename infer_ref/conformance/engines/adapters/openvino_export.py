"""A Hugging Face folder as an OpenVINO model, exported by optimum-intel's own exporter and cached.

OpenVINO GenAI reads no Hugging Face folder: users export it with ``optimum-cli export openvino``
(optimum-intel), which traces the transformers model into OpenVINO IR and converts the tokenizer
with openvino_tokenizers. That exporter is part of what the tier judges (a config.json field it
ignores is a wrong answer of OpenVINO's); it is run exactly as its command line documents for a
local folder: ``--task text-generation-with-past --weight-format fp32``.

One thing comes from outside the venv's own packages: optimum-intel refuses to export Gemma 3 with
a transformers newer than it has validated (its ``gemma3_text`` export config carries a maximum
transformers version); ``scripts/install_openvino.sh`` installs that older transformers on a path
of its own (``VENV/src/export-transformers``, or ``$INFER_REF_OPENVINO_EXPORT_PATH``), put first on
the exporter's ``PYTHONPATH`` where the exporter refused the venv's (see :func:`needs_export_path`).

Exports are cached by the folder's content and the exporter's versions (``$INFER_REF_OPENVINO_CACHE``,
default ``~/.cache/infer_ref/openvino``): a checkpoint is exported once.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from infer_ref.conformance.engines.adapters.subprocess_bridge import EngineWorkerError
from infer_ref.conformance.interface.contract import Unsupported
from infer_ref.errors import DataError

CACHE_ENV = "INFER_REF_OPENVINO_CACHE"
EXPORT_PATH_ENV = "INFER_REF_OPENVINO_EXPORT_PATH"
WEIGHT_FORMAT = "fp32"  # the tier's float32 weights exactly; other dtypes are inference precisions
EXPORTER_PACKAGES = ("optimum-intel", "optimum", "openvino", "openvino-tokenizers", "transformers", "torch")
# What the exporter must write for OpenVINO GenAI to serve the model.
EXPORTED_FILES = (
    "openvino_model.xml",
    "openvino_model.bin",
    "openvino_tokenizer.xml",
    "openvino_detokenizer.xml",
)
CONTENT_PATTERNS = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "*.safetensors",
)
# What optimum-intel says when the installed transformers is newer than a model's export config allows
# ("The current version of Transformers does not allow for the export of the model. Maximum required is 5.0,
# ...").
TRANSFORMERS_TOO_NEW = "does not allow for the export of the model"


@dataclass(frozen=True)
class Exported:
    """An exported model folder and how it came to be (``seconds`` is 0 for a cache hit)."""

    path: Path
    export_path: Path | None  # the older transformers the exporter ran with, None: the venv's own
    seconds: float


def exporter_cli(python: str) -> Path:
    """``optimum-cli`` beside ``python`` (the console script its venv installs)."""
    return Path(python).parent / "optimum-cli"


def export_transformers_path(python: str, given: str | os.PathLike[str] | None = None) -> Path | None:
    """The older transformers for the exporter (``given``, ``$INFER_REF_OPENVINO_EXPORT_PATH``, or
    ``VENV/src/export-transformers``), None where there is none."""
    candidate = (
        given or os.environ.get(EXPORT_PATH_ENV) or Path(python).parent.parent / "src" / "export-transformers"
    )
    path = Path(candidate)
    return path if (path / "transformers").is_dir() else None


def cache_dir(root: str | os.PathLike[str] | None = None) -> Path:
    return Path(root or os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "infer_ref" / "openvino")


def content_digest(model_dir: Path, versions: str) -> str:
    """What decides the exporter's output: the folder's files and the exporter's package versions."""
    digest = hashlib.sha256(f"{WEIGHT_FORMAT}\0{versions}\0".encode())
    for path in sorted({p for pattern in CONTENT_PATTERNS for p in model_dir.glob(pattern) if p.is_file()}):
        digest.update(path.name.encode() + b"\0")
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:24]


def exporter_versions(python: str, env: dict[str, str], export_path: Path | None) -> str:
    """The exporter's package versions as ``python`` sees them (with ``export_path`` first, when given)."""
    script = (
        "import sys\nfrom importlib.metadata import version, PackageNotFoundError\n"
        "for name in sys.argv[1:]:\n"
        "    try: print(name, version(name))\n"
        "    except PackageNotFoundError: print(name, '-')\n"
    )
    env = _with_path(env, export_path)
    try:
        done = subprocess.run(
            [python, "-c", script, *EXPORTER_PACKAGES],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise EngineWorkerError(f"OpenVINO exporter: cannot run {python}: {err}") from None
    return done.stdout.strip().replace("\n", "; ")


def export(
    model_dir: Path,
    *,
    python: str,
    env: dict[str, str],
    cache: str | os.PathLike[str] | None = None,
    export_path: str | os.PathLike[str] | None = None,
    timeout: float = 900.0,
) -> Exported:
    """``model_dir`` exported (cached) by optimum-cli; retried once with the older transformers
    where the exporter refuses the venv's as too new for the architecture."""
    first = _export_cached(model_dir, python, env, cache, None, timeout)
    if isinstance(first, Exported):
        return first
    older = export_transformers_path(python, export_path)
    if older is None or not needs_export_path(first):
        raise _export_error(model_dir, first)
    second = _export_cached(model_dir, python, env, cache, older, timeout)
    if isinstance(second, Exported):
        return second
    raise _export_error(model_dir, second, older)


def needs_export_path(log: str) -> bool:
    """Whether the exporter refused because the venv's transformers is newer than the model allows."""
    return TRANSFORMERS_TOO_NEW in log


def _export_cached(
    model_dir: Path,
    python: str,
    env: dict[str, str],
    cache: str | os.PathLike[str] | None,
    older: Path | None,
    timeout: float,
) -> Exported | str:
    """The exported folder, or the exporter's log where it failed."""
    folder = cache_dir(cache)
    target = folder / f"{model_dir.name}-{content_digest(model_dir, exporter_versions(python, env, older))}"
    if all((target / name).is_file() for name in EXPORTED_FILES):
        return Exported(target, older, 0.0)
    folder.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(dir=folder, prefix=".exporting-") as work:
        partial = Path(work) / "model"
        argv = [
            os.fspath(exporter_cli(python)),
            "export",
            "openvino",
            "--model",
            os.fspath(model_dir.resolve()),
            "--task",
            "text-generation-with-past",
            "--weight-format",
            WEIGHT_FORMAT,
            os.fspath(partial),
        ]
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, env=_with_path(env, older), timeout=timeout, check=False
            )
            log, status = done.stdout + done.stderr, done.returncode
        except subprocess.TimeoutExpired:
            log, status = f"timed out after {timeout:g} s", None
        except OSError as err:
            raise EngineWorkerError(
                f"OpenVINO exporter: cannot run {argv[0]}: {err.strerror or err}"
            ) from None
        missing = [name for name in EXPORTED_FILES if not (partial / name).is_file()]
        if status != 0 or missing:
            return log + (f"\nmissing: the exporter wrote no {', '.join(missing)}" if status == 0 else "")
        if target.exists():
            shutil.rmtree(target)
        os.replace(partial, target)  # whole or not at all: a crash leaves no half-written folder cached
    return Exported(target, older, time.monotonic() - start)


def _with_path(env: dict[str, str], older: Path | None) -> dict[str, str]:
    return env if older is None else {**env, "PYTHONPATH": os.fspath(older)}


def _export_error(model_dir: Path, log: str, older: Path | None = None) -> Exception:
    """The exporter's refusal in one line: its last error line (an unsupported architecture is "not
    supported")."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    last = next(
        (line for line in reversed(lines) if "Error" in line or line.startswith("missing:")),
        lines[-1] if lines else "(no output)",
    )
    with_path = f" (transformers from {older})" if older else ""
    message = f"optimum-cli export openvino failed on {model_dir}{with_path}: {last[:300]}"
    if "not supported" in last.lower() or "unsupported" in last.lower() or needs_export_path(log):
        return Unsupported(message)
    return DataError(message)
