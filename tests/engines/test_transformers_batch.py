"""transformers' continuous batching adapter: what it declares it cannot do is refused per request,
and requests that differ in per-call settings go out as separate calls, in order."""

from __future__ import annotations

import pytest

from infer_ref.conformance.engines.adapters.transformers_batch import (
    CAPABILITIES,
    _check_supported,
    _groups,
    start_transformers_batch,
)
from infer_ref.conformance.engines.protocol import EngineOptions, EngineRequest
from infer_ref.conformance.interface.contract import Unsupported
from infer_ref.paths import FIXTURE_CHECKPOINTS

P = (1, 2, 3)


@pytest.mark.parametrize(
    ("request_", "why"),
    [
        (EngineRequest(P, 4, temperature=0.7, seed=1), "sampling settings are per call"),
        (EngineRequest(P, 4, stop=("x",)), "no stop strings"),
        (EngineRequest(P, 4, prompt_logprobs=2), "no prompt logprobs"),
    ],
)
def test_what_generate_batch_lacks_is_refused_naming_the_request(request_: EngineRequest, why: str) -> None:
    with pytest.raises(Unsupported, match=f"request 3: .*{why}"):
        _check_supported(3, request_)


def test_the_refused_features_are_not_declared() -> None:
    assert not {"seed", "stop_strings", "prompt_logprobs", "top_logprobs", "reset_prefix_cache"} & CAPABILITIES


def test_requests_grouped_by_per_call_settings_in_order() -> None:
    requests = [EngineRequest(P, 4), EngineRequest(P, 8), EngineRequest(P, 4, ignore_eos=True), EngineRequest(P, 4), EngineRequest(P, 8)]
    assert _groups(requests) == [[0, 3], [1, 4], [2]]


def test_a_page_size_transformers_refuses_is_not_supported_at_start() -> None:
    """generate_batch raises on a page of 1 position at its first call; the start says so instead,
    so the long-context workload's block-1 tests are "not supported", not failed."""
    with pytest.raises(Unsupported, match="page_size must be at least"):
        start_transformers_batch(FIXTURE_CHECKPOINTS / "llama-tiny", EngineOptions(block_size=1))
    assert start_transformers_batch(FIXTURE_CHECKPOINTS / "llama-tiny", EngineOptions(block_size=16)).batching.page_size == 16
