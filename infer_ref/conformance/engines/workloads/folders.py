"""The checkpoint folders a workload runs on when none are given: the kit's own."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from infer_ref.conformance.engines.workloads.checkpoints import write_all
from infer_ref.conformance.engines.workloads.long_checkpoints import LONG_CHECKPOINTS, LONG_STYLE
from infer_ref.paths import FIXTURE_CHECKPOINTS

CHECKPOINTS_ENV = "INFER_REF_ENGINE_CHECKPOINTS"


def default_model_dirs(
    progress: Callable[[str], None] | None = None, *, long_context: bool = False
) -> list[Path]:
    """The kit's checkpoints: the three trained fixtures (from a checkout, or the wheel's data folder)
    and the engine checkpoints written from them on first use (in both config.json styles, under
    ``$INFER_REF_ENGINE_CHECKPOINTS``, default ``~/.cache/infer_ref/engine-checkpoints``; ``progress``
    hears a line per folder written). ``long_context``: the long-context checkpoints instead, in
    their one style. None without the fixtures."""
    if not FIXTURE_CHECKPOINTS.is_dir():
        return []
    if long_context:
        return write_all(engine_checkpoints_root(), progress, specs=LONG_CHECKPOINTS, styles=(LONG_STYLE,))
    fixtures = sorted(p for p in FIXTURE_CHECKPOINTS.iterdir() if (p / "config.json").is_file())
    return fixtures + write_all(engine_checkpoints_root(), progress)


def engine_checkpoints_root() -> Path:
    """Where the kit's engine checkpoints are written: ``$INFER_REF_ENGINE_CHECKPOINTS``, default
    ``~/.cache/infer_ref/engine-checkpoints``."""
    return Path(
        os.environ.get(CHECKPOINTS_ENV) or Path.home() / ".cache" / "infer_ref" / "engine-checkpoints"
    )


__all__ = ["CHECKPOINTS_ENV", "default_model_dirs", "engine_checkpoints_root"]
