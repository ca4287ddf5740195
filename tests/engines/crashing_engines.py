"""Engines that fail as engines do (``--ir-engine crashing_engines:NAME`` with this folder on the
path): one never starts, one raises while answering. Nothing judged is never "wrong"; a crash is a
failure with a repro script like any other."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from infer_ref.conformance.engines.protocol import EngineOptions, EngineOutput, EngineRequest

CAPABILITIES = frozenset({"batch", "top_logprobs"})


def never_starts(model_dir: Path, options: EngineOptions) -> CrashingEngine:
    raise RuntimeError(f"no kernel for {Path(model_dir).name}")


class CrashingEngine:
    capabilities = CAPABILITIES
    name = "crashing engine"

    def generate(self, requests: Sequence[EngineRequest]) -> list[EngineOutput]:
        raise RuntimeError(f"illegal memory access in a batch of {len(requests)}")

    def reset_prefix_cache(self) -> None: ...

    def stop(self) -> None: ...


def crashes(model_dir: Path, options: EngineOptions) -> CrashingEngine:
    return CrashingEngine()


never_starts.capabilities = CAPABILITIES  # type: ignore[attr-defined]
crashes.capabilities = CAPABILITIES  # type: ignore[attr-defined]
