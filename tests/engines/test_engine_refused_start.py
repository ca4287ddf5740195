"""An engine that declines a kind of start (Unsupported) makes the tests needing it "not supported",
once: the tier does not start it again, and a real start failure still fails."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infer_ref.conformance.engines.adapters.subprocess_bridge import WORKERS_DIR
from infer_ref.conformance.engines.protocol import EngineHandle, EngineOptions
from infer_ref.conformance.engines.session import EngineSession, EngineStartError
from infer_ref.conformance.engines.settings import TierSettings
from infer_ref.conformance.interface.contract import Unsupported

STARTS: list[bool] = []


def refuse_plain(model_dir: Path, options: EngineOptions) -> EngineHandle:
    STARTS.append(options.prefix_caching)
    if not options.prefix_caching:
        raise Unsupported("this server always reuses the previous request's prefix")
    raise RuntimeError("the stressed start crashed")


def test_a_declined_start_is_unsupported_once_and_a_crash_still_fails(tmp_path: Path) -> None:
    STARTS.clear()
    tier = EngineSession(TierSettings(engine=f"{__name__}:refuse_plain", endpoint=None, dtype="float32"))
    for _ in range(2):
        with pytest.raises(Unsupported, match=r"\(plain start\): Unsupported: this server always reuses"):
            tier.handle(tmp_path, "plain")
    with pytest.raises(EngineStartError, match="could not start .* RuntimeError: the stressed start crashed"):
        tier.handle(tmp_path, "stressed")
    assert STARTS == [False, True]



# vLLM's start failure in the worker: its ModelConfig's validation error, whole.
VLLM_DECLINES_FLOAT16 = (
    "1 validation error for ModelConfig\n"
    "  Value error, The model type 'gemma3_text' does not support float16. Reason: Numerical instability. "
    "Please use bfloat16 or float32 instead. [type=value_error, input_value=ArgsKwargs((), {'model': ...})]"
)


@pytest.fixture
def vllm_options() -> Iterator[Any]:
    """The vLLM workers' option module (standard library only; it imports its siblings by name)."""
    sys.path.insert(0, os.fspath(WORKERS_DIR))
    try:
        yield importlib.import_module("vllm_options")
    finally:
        sys.path.remove(os.fspath(WORKERS_DIR))


def test_vllm_declining_a_dtype_is_found_with_its_own_reason(vllm_options: Any) -> None:
    """The worker answers this start "unsupported" with vLLM's sentence (``vllm_worker.start``)."""
    assert vllm_options.declined_dtype(VLLM_DECLINES_FLOAT16, "float16") == (
        "The model type 'gemma3_text' does not support float16. Reason: Numerical instability."
    )


@pytest.mark.parametrize(
    ("message", "dtype"),
    [
        (VLLM_DECLINES_FLOAT16, "bfloat16"),  # it declined another dtype than the one asked: a fault
        ("CUDA out of memory", "float16"),
        ("does not support float16", "float16"),  # not its model-type refusal
    ],
)
def test_any_other_vllm_start_failure_stays_a_failure(vllm_options: Any, message: str, dtype: str) -> None:
    assert vllm_options.declined_dtype(message, dtype) is None


@pytest.mark.parametrize(("dtype", "reason"), [("float16", "would not compute in float16"), ("bfloat16", "does not start")])
def test_ortgenai_low_precision_on_the_cpu_is_refused_before_any_build(tmp_path: Path, dtype: str, reason: str) -> None:
    """Refused with what was measured, before the builder or the worker is run (this interpreter
    does not exist)."""
    from infer_ref.conformance.engines.adapters.ortgenai import start_ortgenai

    model_dir = Path(__file__).resolve().parents[2] / "fixtures" / "checkpoints" / "llama-tiny"
    with pytest.raises(Unsupported, match=reason):
        start_ortgenai(model_dir, EngineOptions(dtype=dtype, prefix_caching=False), python=tmp_path / "no-python", cache=tmp_path)
    assert not any(tmp_path.iterdir()), "a refused start built something"
