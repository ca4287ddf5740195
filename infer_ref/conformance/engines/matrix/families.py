"""A checkpoint folder's model family: from its config.json's ``model_type`` where the folder is
found, else from its name (the kit's folders start with the family: ``gemma3-window40-...``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

# model_type -> family, in the order the matrix shows them
FAMILY_OF_MODEL_TYPE = {"llama": "Llama", "qwen3": "Qwen 3", "gemma3_text": "Gemma 3", "gemma3": "Gemma 3"}
FAMILY_ORDER = ("Llama", "Qwen 3", "Gemma 3")
_NAME_PREFIXES = (("qwen3", "Qwen 3"), ("gemma3", "Gemma 3"), ("llama", "Llama"))


def default_search_dirs() -> list[Path]:
    """Where the tier's checkpoints live: the fixtures, and the kit's engine checkpoints."""
    from infer_ref.conformance.engines.workloads.checkpoints import FIXTURE_CHECKPOINTS
    from infer_ref.conformance.engines.workloads.folders import engine_checkpoints_root

    return [FIXTURE_CHECKPOINTS, engine_checkpoints_root()]


def family_of(checkpoint: str, search_dirs: Sequence[Path] | None = None) -> str:
    """``Llama`` / ``Qwen 3`` / ``Gemma 3`` for a checkpoint folder name; an unknown one is its own family."""
    for folder in search_dirs if search_dirs is not None else default_search_dirs():
        config = folder / checkpoint / "config.json"
        if config.is_file():
            try:
                model_type = json.loads(config.read_text()).get("model_type")
            except (OSError, ValueError):
                break
            if model_type in FAMILY_OF_MODEL_TYPE:
                return FAMILY_OF_MODEL_TYPE[model_type]
            break
    lowered = checkpoint.lower()
    return next((family for prefix, family in _NAME_PREFIXES if lowered.startswith(prefix)), checkpoint)


def family_sort_key(family: str) -> tuple[int, str]:
    return (FAMILY_ORDER.index(family), "") if family in FAMILY_ORDER else (len(FAMILY_ORDER), family)
