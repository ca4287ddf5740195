"""``--engine-option KEY=VALUE``: an engine's own settings, passed to its factory as keywords.

The tier's options (:class:`~infer_ref.conformance.engines.protocol.EngineOptions`) are what every
engine is started with; an adapter's other settings (llama.cpp's ``kv_cache_type`` and
``threads``, a start timeout) are keyword arguments of its factory. Each given option must name
one of them, and its value must parse as that keyword's annotated type (``int``, ``float``,
``bool`` as ``true``/``false``, else text): a typo is an error naming what the factory takes,
never an option silently dropped.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence

# keywords every factory takes positionally from the tier: never an --engine-option
TIER_PARAMETERS = ("model_dir", "options")


class EngineOptionError(ValueError):
    """An --engine-option the factory cannot take; the message names what it takes."""


def factory_keywords(factory: Callable[..., object]) -> dict[str, str]:
    """The factory's own keyword parameters and their annotations as text (``""`` where none)."""
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return {}
    kinds = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return {
        p.name: _annotation_text(p.annotation)
        for p in parameters
        if p.kind in kinds and p.name not in TIER_PARAMETERS
    }


def parse_engine_options(
    pairs: Sequence[str], factory: Callable[..., object], engine: str
) -> dict[str, object]:
    """``["kv_cache_type=float16", "threads=2"]`` -> keywords for ``factory``, each checked."""
    takes = factory_keywords(factory)
    parsed: dict[str, object] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise EngineOptionError(f"--engine-option {pair!r}: expected KEY=VALUE")
        if key not in takes:
            offered = ", ".join(sorted(takes)) or "none"
            raise EngineOptionError(
                f"--engine-option {key}: {engine}'s factory takes no such keyword (it takes: {offered})"
            )
        if key in parsed:
            raise EngineOptionError(f"--engine-option {key} given twice")
        parsed[key] = _parse_value(key, text, takes[key])
    return parsed


def _annotation_text(annotation: object) -> str:
    if annotation is inspect.Parameter.empty:
        return ""
    return annotation if isinstance(annotation, str) else getattr(annotation, "__name__", str(annotation))


def _parse_value(key: str, text: str, annotation: str) -> object:
    """``text`` as the annotated type; ``none`` only where the annotation allows None."""
    kinds = {part.strip() for part in annotation.split("|")}
    if text.lower() == "none":
        if "None" in kinds:
            return None
        raise EngineOptionError(f"--engine-option {key}=none: {key} ({annotation}) cannot be None")
    if kinds & {"str", "os.PathLike[str]", "PathLike[str]", "Path"} or not annotation:
        return text
    if "bool" in kinds:
        if text.lower() not in ("true", "false"):
            raise EngineOptionError(f"--engine-option {key}={text!r}: expected true or false")
        return text.lower() == "true"
    numeric = [convert for name, convert in (("int", int), ("float", float)) if name in kinds]
    for convert in numeric:
        try:
            return convert(text)
        except ValueError:
            continue
    if numeric:
        raise EngineOptionError(f"--engine-option {key}={text!r}: expected {annotation}")
    return text
