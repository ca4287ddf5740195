"""A Hugging Face folder as a GGUF file, converted by llama.cpp's own converter and cached.

llama.cpp reads no Hugging Face folder: users convert it with ``convert_hf_to_gguf.py`` from a
llama.cpp source tree, so that converter is part of what the tier judges (a config.json field it
ignores is a wrong answer of llama.cpp's). It is never replaced by a converter of ours; the one
thing added from outside is the name of the BPE pre-tokenizer where the converter's recognition
(a hash of the tokenizer's output on a test string, known only for published tokenizers) fails:
:func:`pre_tokenizer_for` reads the folder's tokenizer.json split regex and names the llama.cpp
pre-tokenizer whose regex is that one (``workers/llamacpp_convert.py`` passes it on).

Converted files are cached by the folder's content, the output type and the converter's source
(``$INFER_REF_GGUF_CACHE``, default ``~/.cache/infer_ref/gguf``): a checkpoint is converted once.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infer_ref.conformance.engines.adapters.conversion_cache import cache_dir as conversion_cache_dir
from infer_ref.conformance.engines.adapters.conversion_cache import content_digest as folder_digest
from infer_ref.conformance.engines.adapters.subprocess_bridge import WORKERS_DIR, EngineWorkerError
from infer_ref.conformance.interface.contract import Unsupported
from infer_ref.errors import EXIT_MISSING, DataError, UsageError

SOURCE_ENV = "INFER_REF_LLAMACPP_SOURCE"
CACHE_ENV = "INFER_REF_GGUF_CACHE"
CONVERT_SCRIPT = WORKERS_DIR / "llamacpp_convert.py"
CONVERTER = "convert_hf_to_gguf.py"
NO_PRE_TOKENIZER = "-"  # the converter's own recognition, nothing named
# The tier's dtypes as the converter's --outtype (float64 has no GGUF type llama.cpp computes in).
OUTTYPES = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}
# llama.cpp's pre-tokenizers by the split regex of the tokenizer.json they reproduce: each regex is
# the one llama.cpp's src/llama-vocab.cpp quotes as the "original regex from tokenizer.json" of
# that pre-tokenizer (its own is the same regex with the case-insensitive group spelled out).
PRE_TOKENIZERS = {
    # Llama 3: digits in groups of up to three.
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+": "llama-bpe",
    # Qwen 2/3: one digit per piece.
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+": "qwen2",
}


class LlamaCppSourceMissing(UsageError):
    """No llama.cpp source tree with its converter was named."""

    exit_code = EXIT_MISSING


@dataclass(frozen=True)
class Converted:
    """A GGUF file and how it came to be (``seconds`` is 0 for a cache hit)."""

    path: Path
    outtype: str
    pre_tokenizer: str | None
    seconds: float


def llamacpp_source(source: str | os.PathLike[str] | None, python: str) -> Path:
    """The llama.cpp tree: ``source``, else ``$INFER_REF_LLAMACPP_SOURCE``, else ``src/llama.cpp`` in
    the venv of ``python`` (where scripts/install_llamacpp.sh leaves it); one error when none has
    the converter."""
    venv_tree = Path(python).parent.parent / "src" / "llama.cpp"
    candidate = source if source is not None else os.environ.get(SOURCE_ENV) or venv_tree
    tree = Path(candidate)
    if not (tree / CONVERTER).is_file():
        raise LlamaCppSourceMissing(
            f"no llama.cpp converter at {tree / CONVERTER}: set {SOURCE_ENV} to a llama.cpp source tree "
            "(llama-cpp-python's sdist has one in vendor/llama.cpp; scripts/install_llamacpp.sh unpacks it)"
        )
    return tree


def pre_tokenizer_for(model_dir: Path) -> str | None:
    """The llama.cpp pre-tokenizer reproducing the folder's tokenizer.json split, None where it has
    no byte-level BPE tokenizer.json (the converter then reads what it reads); refuses a regex
    llama.cpp has no pre-tokenizer for."""
    path = model_dir / "tokenizer.json"
    if not path.is_file():
        return None
    spec = json.loads(path.read_text(encoding="utf-8"))
    if spec.get("model", {}).get("type") != "BPE":
        return None
    regexes = [
        p["pattern"]["Regex"]
        for p in _pre_tokenizers(spec.get("pre_tokenizer"))
        if p.get("type") == "Split" and "Regex" in p.get("pattern", {})
    ]
    if spec.get("normalizer") is not None or len(regexes) != 1:
        raise Unsupported(
            f"{path}: a normalizer or not exactly one split regex; no llama.cpp pre-tokenizer "
            "is known to reproduce it"
        )
    name = PRE_TOKENIZERS.get(regexes[0])
    if name is None:
        raise Unsupported(f"{path}: llama.cpp has no pre-tokenizer known to split with {regexes[0]!r}")
    return name


def _pre_tokenizers(node: dict[str, Any] | None) -> list[dict[str, Any]]:
    if node is None:
        return []
    if node.get("type") == "Sequence":
        return [p for child in node.get("pretokenizers", []) for p in _pre_tokenizers(child)]
    return [node]


def content_digest(model_dir: Path, outtype: str, source: Path, pre_tokenizer: str | None) -> str:
    """What decides the converter's output: the folder's files, the outtype, the converter's code."""
    converter_files = [source / CONVERTER, *sorted((source / "conversion").glob("*.py"))]
    return folder_digest(model_dir, f"{outtype}\0{pre_tokenizer}", converter_files)


def cache_dir(root: str | os.PathLike[str] | None = None) -> Path:
    return conversion_cache_dir(root, CACHE_ENV, "gguf")


def convert(
    model_dir: Path,
    dtype: str,
    *,
    python: str,
    source: Path,
    env: dict[str, str],
    cache: str | os.PathLike[str] | None = None,
    timeout: float = 900.0,
) -> Converted:
    """``model_dir`` as a GGUF file of ``dtype`` (cached), converted by ``source``'s converter."""
    if dtype not in OUTTYPES:
        raise Unsupported(
            f"llama.cpp's converter writes no {dtype} weights (it writes {', '.join(OUTTYPES)})"
        )
    outtype = OUTTYPES[dtype]
    pre_tokenizer = pre_tokenizer_for(model_dir)
    folder = cache_dir(cache)
    target = (
        folder
        / f"{model_dir.name}-{content_digest(model_dir, outtype, source, pre_tokenizer)}-{outtype}.gguf"
    )
    if target.is_file():
        return Converted(target, outtype, pre_tokenizer, 0.0)
    folder.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(dir=folder, prefix=".converting-") as work:
        partial = Path(work) / target.name
        log = Path(work) / "convert.log"
        argv = [
            python,
            os.fspath(CONVERT_SCRIPT),
            os.fspath(source),
            pre_tokenizer or NO_PRE_TOKENIZER,
            os.fspath(model_dir.resolve()),
            "--outtype",
            outtype,
            "--outfile",
            os.fspath(partial),
        ]
        with open(log, "wb") as out:
            try:
                status = subprocess.run(
                    argv, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=timeout, check=False
                ).returncode
            except subprocess.TimeoutExpired:
                status = None
            except OSError as err:
                raise EngineWorkerError(
                    f"llama.cpp converter: cannot run {python}: {err.strerror or err}"
                ) from None
        if status != 0 or not partial.is_file():
            raise _conversion_error(model_dir, outtype, status, log.read_text(errors="replace"))
        os.replace(partial, target)  # whole or not at all: a crash leaves no half-written file cached
    return Converted(target, outtype, pre_tokenizer, time.monotonic() - start)


def _conversion_error(model_dir: Path, outtype: str, status: int | None, log: str) -> Exception:
    """The converter's refusal in one line: its last error line (a refused architecture is "not
    supported")."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    last = next(
        (line for line in reversed(lines) if "Error" in line or line.startswith("missing:")),
        lines[-1] if lines else "",
    )
    what = "timed out" if status is None else f"exited with status {status}"
    message = f"llama.cpp's converter {what} on {model_dir} (--outtype {outtype}): {last[:300]}"
    if "not supported" in last.lower() or "NotImplementedError" in last:
        return Unsupported(message)
    return DataError(message)
