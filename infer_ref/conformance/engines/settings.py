"""The engine tier's settings: what the run's options chose, built once and read everywhere.

The engine (a registry name, a user's ``module:FACTORY``, or a running endpoint), its dtype and
the dtype policy that follows (position by position, or by distribution in low precision), the
checkpoint folders, the workload (default or long-context) and its start geometry, the factory's
own keywords, and the tolerances the verdicts judge at: the oracle's, and the self-consistency
tolerance measured on the engine (or given). :meth:`TierSettings.of` builds it from pytest's
options, once per run; the session, the verdicts' callers, the report's notes and the header read it.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infer_ref.conformance.engines.registry import ENGINES
from infer_ref.conformance.engines.verdicts.tolerances import (
    LOW_PRECISION,
    ConsistencyTolerance,
    agreement_tolerance,
    consistency_tolerance,
)
from infer_ref.conformance.engines.workloads.geometry import Geometry, geometry_of

if TYPE_CHECKING:
    import pytest

DEFAULT_ENGINE = "infer_ref"
_STASH: dict[str, Any] = {}  # the pytest stash key the settings are kept under (made on first use)


def _stash_key() -> Any:
    """The key of the settings in a pytest config's stash (pytest imported here, not above: the
    commands that start engines, calibrate and power, run without it)."""
    from pytest import StashKey

    return _STASH.setdefault("key", StashKey["TierSettings"]())


@dataclass(frozen=True)
class TierSettings:
    """One run's choices (see the module's docstring); what a repro command needs to select them again."""

    engine: str | None = (
        None  # --ir-engine: a registry name or module:FACTORY (None: infer_ref, or an endpoint)
    )
    endpoint: str | None = None  # --ir-endpoint: a running OpenAI-compatible server
    dtype: str = "float32"  # --ir-engine-dtype
    model_dirs: tuple[Path, ...] = ()  # --ir-model-dir (none: the kit's checkpoints)
    consistency_given: float | None = None  # --ir-consistency-tolerance
    engine_options: tuple[str, ...] = ()  # --ir-engine-option KEY=VALUE: the factory's own keywords
    long_context: bool = False  # --ir-long-context: the long-context workload

    @classmethod
    def of(cls, config: pytest.Config) -> TierSettings:
        """The settings of the run ``config`` configures (built on first use, the same object after)."""
        key = _stash_key()
        if key not in config.stash:
            config.stash[key] = cls.from_options(config.getoption)
        settings: TierSettings = config.stash[key]
        return settings

    @classmethod
    def from_options(cls, option: Callable[[str], Any]) -> TierSettings:
        """The settings the tier's pytest options (``option(name)``: ``config.getoption``) choose."""
        return cls(
            engine=option("--ir-engine"),
            endpoint=option("--ir-endpoint"),
            dtype=str(option("--ir-engine-dtype")),
            model_dirs=tuple(Path(d) for d in option("--ir-model-dir") or ()),
            consistency_given=option("--ir-consistency-tolerance"),
            engine_options=tuple(option("--ir-engine-option") or ()),
            long_context=bool(option("--ir-long-context")),
        )

    @property
    def name(self) -> str:
        """How the report and the messages name the engine."""
        return f"endpoint {self.endpoint}" if self.endpoint else (self.engine or DEFAULT_ENGINE)

    @property
    def factory_spec(self) -> str:
        """The engine's factory as ``module:function`` (a registry name resolved)."""
        engine = self.engine or DEFAULT_ENGINE
        return ENGINES.get(engine, engine)

    @property
    def registered(self) -> str | None:
        """The engine's registry name (its measured spreads), None for an endpoint or a user's factory."""
        engine = None if self.endpoint else (self.engine or DEFAULT_ENGINE)
        return engine if engine in ENGINES else None

    @property
    def endpoint_model_dir(self) -> Path | None:
        """The folder an endpoint serves (the one --ir-model-dir given with --ir-endpoint)."""
        return self.model_dirs[0] if self.endpoint and self.model_dirs else None

    @property
    def low_precision(self) -> bool:
        """bfloat16 and float16 are judged by distribution; float32 and float64 position by position."""
        return self.dtype in LOW_PRECISION

    @property
    def geometry(self) -> Geometry:
        return geometry_of(self.long_context)

    @cached_property
    def consistency(self) -> ConsistencyTolerance:
        """The self-consistency tolerance
        (:func:`~infer_ref.conformance.engines.verdicts.tolerances.consistency_tolerance`);
        raises ``ValueError`` for a given tolerance out of range."""
        return consistency_tolerance(
            self.registered, self.dtype, self.consistency_given, long_context=self.long_context
        )

    def oracle_tolerance(self, positions: int = 0) -> float:
        """The agreement tolerance for a request of ``positions`` positions (0: the flat one)."""
        return agreement_tolerance(self.dtype, positions)

    def oracle_note(self) -> tuple[float, str]:
        """The oracle tolerance the report's note states, and where it comes from: the longest
        request's on the long-context workload (each request is judged at its own length's)."""
        if not self.long_context:
            return self.oracle_tolerance(), f"the oracle tolerance for {self.dtype}"
        longest = self.geometry.max_model_len
        return (
            self.oracle_tolerance(longest),
            f"the oracle tolerance for {self.dtype} at {longest} positions (each request is judged at its "
            "own length's)",
        )

    def selection(self) -> list[str]:
        """The pytest options that select this engine, started the same way (and the workload): what a
        repro command needs beside the test and the checkpoint folder."""
        options = [
            f"--ir-endpoint={self.endpoint}"
            if self.endpoint
            else f"--ir-engine={self.engine or DEFAULT_ENGINE}"
        ]
        if self.long_context:
            options.append("--ir-long-context")
        if self.dtype != "float32":
            options.append(f"--ir-engine-dtype={self.dtype}")
        return options + [f"--ir-engine-option={shlex.quote(o)}" for o in self.engine_options]

    def selects(self) -> str:
        """:meth:`selection` as one command-line fragment."""
        return " ".join(self.selection())

    def describe(self) -> dict[str, Any]:
        """The report's header fields: the selection with the folders, the engine, the dtype."""
        folders = [f"--ir-model-dir={shlex.quote(str(d))}" for d in self.model_dirs]
        return {
            "impl": " ".join(self.selection() + folders),
            "version": self.engine or self.endpoint or DEFAULT_ENGINE,
        }


__all__ = ["DEFAULT_ENGINE", "TierSettings"]
