"""transformers' continuous batching adapter: what it declares it cannot do is refused per request,
and requests that differ in per-call settings go out as separate calls, in order."""

from __future__ import annotations

import dataclasses
import sys

import pytest
import transformers
from transformers.generation import configuration_utils

from infer_ref.conformance.engines.adapters.transformers_batch import (
    CAPABILITIES,
    _batching_config,
    _check_supported,
    _groups,
    _out_of_bounds,
    start_transformers_batch,
)
from infer_ref.conformance.engines.protocol import EngineOptions, EngineRequest
from infer_ref.conformance.interface.contract import Unsupported
from infer_ref.paths import FIXTURE_CHECKPOINTS

P = (1, 2, 3)
# ContinuousBatchingConfig is newer than the oldest transformers the test extras declare (5.0); there
# the adapter refuses to start, as not supported (test_a_transformers_without_the_config_is_not_supported).
needs_batching_config = pytest.mark.skipif(
    not hasattr(configuration_utils, "ContinuousBatchingConfig"),
    reason=f"transformers {transformers.__version__} has no ContinuousBatchingConfig",
)


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


@needs_batching_config
def test_a_page_size_transformers_refuses_is_not_supported_at_start() -> None:
    """generate_batch raises on a page of 1 position at its first call; the start says so instead,
    so the long-context workload's block-1 tests are "not supported", not failed."""
    with pytest.raises(Unsupported, match=rf"transformers {transformers.__version__} .*page_size must be at least 4"):
        start_transformers_batch(FIXTURE_CHECKPOINTS / "llama-tiny", EngineOptions(block_size=1))
    engine = start_transformers_batch(FIXTURE_CHECKPOINTS / "llama-tiny", EngineOptions(block_size=16))
    assert engine.page_size == 16
    fields = dataclasses.asdict(engine.batching)
    assert fields.get("page_size", fields.get("block_size")) == 16


@dataclasses.dataclass
class _ConfigBefore518:
    """ContinuousBatchingConfig's fields as transformers 5.17 names them: the page is ``block_size``."""

    block_size: int = 256
    num_blocks: int | None = None
    max_batch_tokens: int | None = None
    max_requests_per_batch: int | None = None
    allow_block_sharing: bool = True
    use_cuda_graph: bool | None = None
    return_logprobs: bool = False


def test_a_transformers_without_the_config_is_not_supported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(configuration_utils, "ContinuousBatchingConfig", raising=False)
    with pytest.raises(Unsupported, match=rf"transformers {transformers.__version__} has no ContinuousBatchingConfig"):
        _batching_config(EngineOptions(), 32)


def test_the_page_goes_under_the_name_the_installed_transformers_gives_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers 5.17 calls the page ``block_size`` (``page_size`` from 5.18): passing the newer
    name there was a TypeError that failed every test of a correct engine at its start."""
    monkeypatch.setattr(configuration_utils, "ContinuousBatchingConfig", _ConfigBefore518, raising=False)
    config = _batching_config(EngineOptions(block_size=8, kv_cache_tokens=64), 8)
    assert (config.block_size, config.num_blocks) == (8, 64 // 8)


def test_a_setting_the_installed_transformers_lacks_is_not_supported(monkeypatch: pytest.MonkeyPatch) -> None:
    kept = [(f.name, f.type, f.default) for f in dataclasses.fields(_ConfigBefore518) if f.name != "return_logprobs"]
    no_logprobs = dataclasses.make_dataclass("NoLogprobs", kept)
    monkeypatch.setattr(configuration_utils, "ContinuousBatchingConfig", no_logprobs, raising=False)
    lacks = rf"transformers {transformers.__version__} ContinuousBatchingConfig has no return_logprobs"
    with pytest.raises(Unsupported, match=lacks):
        _batching_config(EngineOptions(), 32)



def test_before_the_bounds_check_the_paged_caches_minimum_refuses_a_small_page(monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers 5.17 has no check_cb_values_bounds: its paged cache refused a page below
    ``_min_block_size`` (4) at the first call, so the start asks that minimum instead."""
    from transformers.generation.continuous_batching import cache

    monkeypatch.setitem(sys.modules, "transformers.generation.continuous_batching.initialization", None)  # no such module
    monkeypatch.setattr(cache.PagedAttentionCache, "_min_block_size", 4, raising=False)
    assert _out_of_bounds(None, 3) == "page_size must be at least 4 (the paged cache's minimum), got 3"
    assert _out_of_bounds(None, 4) is None
