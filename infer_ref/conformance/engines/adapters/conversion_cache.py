"""A checkpoint folder converted by an engine's own converter, cached by what decides the output.

Engines that read no Hugging Face folder (llama.cpp's GGUF, CTranslate2's model directory) are
judged on what their converter writes. A conversion takes seconds to minutes, so its output is
kept under a cache folder, named by a digest of the checkpoint's files, the converter's settings
and the converter's own version (its code, or its package version): a changed folder or a new
converter converts again, an unchanged one never does.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path

# The files of a checkpoint folder that decide what a converter writes.
CONTENT_PATTERNS = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "*.safetensors",
)


def content_digest(model_dir: Path, settings: str, converter_files: Iterable[Path] = ()) -> str:
    """A digest of the folder's converter-relevant files, ``settings`` (the converter's options and
    version, as one string) and ``converter_files`` (the converter's code, where it is a source tree)."""
    digest = hashlib.sha256(f"{settings}\0".encode())
    files = sorted({p for pattern in CONTENT_PATTERNS for p in model_dir.glob(pattern) if p.is_file()})
    for path in [*files, *converter_files]:
        digest.update(path.name.encode() + b"\0")
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:24]


def cache_dir(root: str | os.PathLike[str] | None, env_var: str, name: str) -> Path:
    """``root``, else ``$env_var``, else ``~/.cache/infer_ref/<name>``."""
    return Path(root or os.environ.get(env_var) or Path.home() / ".cache" / "infer_ref" / name)
