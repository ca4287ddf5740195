"""The sliding-window ring-buffer example passes; the two broken rings are caught.

``examples/ring_buffer_adapter.py`` keeps only ``window`` slots per sliding layer and has no mask
function (the kit probes ``attend``). ``examples/ring_buffer_bugs.py`` holds a ring written before
attending and masked in slot order — exact for single-token decode, wrong for multi-token steps
that wrap — and the same ring refusing steps longer than the window with ``Unsupported``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conformance_run import conformance

from examples.ring_buffer_bugs import WRAP_READS_FUTURE
from infer_ref.conformance.interface.adapter import CacheSpec
from infer_ref.conformance.oracles.definitions import naive_attention, visible_keys

RING_TESTS = ("-k", "test_cache or test_attention or test_masks")
CATCHING = ("-k", "test_update_writes or test_attention or test_boundary_cases or test_mask_is_the_definition")


def _attend_all(chunks: list[int], window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The broken ring's outputs for ``chunks`` and the float64 oracle's, over the same q/k/v."""
    total = sum(chunks)
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, total, 4, generator=g, dtype=torch.float64) for _ in range(3))
    assert WRAP_READS_FUTURE.make_cache is not None and WRAP_READS_FUTURE.attend is not None
    cache = WRAP_READS_FUTURE.make_cache(CacheSpec(1, 1, 2, 4, total, torch.float64, "cpu", (window,)))
    outs, start = [], 0
    for n in chunks:
        outs.append(WRAP_READS_FUTURE.attend(q[..., start : start + n, :], k[..., start : start + n, :], v[..., start : start + n, :], cache, 0, window, 0.5))
        start += n
    return torch.cat(outs, dim=2), naive_attention(q, k, v, visible_keys(total, 0, window), 0.5)


def test_the_wrapping_bug_hides_from_single_token_decode() -> None:
    """Decode one token at a time well past the window: exact. One 3-token step that wraps: wrong."""
    got, want = _attend_all([4] + [1] * 12, window=4)
    assert torch.allclose(got, want, atol=1e-12, rtol=0)
    got, want = _attend_all([4, 3], window=4)
    assert torch.allclose(got[..., :4, :], want[..., :4, :], atol=1e-12, rtol=0)
    assert not torch.allclose(got[..., 4:, :], want[..., 4:, :], atol=1e-3, rtol=0)


@pytest.mark.kit_run
def test_the_ring_buffer_example_passes(tmp_path: Path) -> None:
    run = conformance("examples.ring_buffer_adapter:ADAPTER", *RING_TESTS, cwd=tmp_path)
    assert run.returncode == 0, run.output[-4000:]
    caps = run.report["by_capability"]
    for capability in ("cache", "cache.errors", "mask", "attention"):
        assert caps[capability]["counts"]["failed"] == 0 and caps[capability]["counts"]["passed"] > 0, (capability, caps[capability])


@pytest.mark.kit_run
def test_a_ring_that_wraps_wrong_is_caught(tmp_path: Path) -> None:
    run = conformance("examples.ring_buffer_bugs:WRAP_READS_FUTURE", *CATCHING, cwd=tmp_path, profile="mutants")
    assert run.returncode == 1, run.output[-4000:]
    caps = run.report["by_capability"]
    assert caps["attention"]["counts"]["failed"] == 1 and caps["mask"]["counts"]["failed"] > 0, caps
    assert "K returned by update(window layer" in run.output  # the oldest keys of the window are gone


@pytest.mark.kit_run
def test_a_ring_that_refuses_long_steps_is_judged_below_the_window(tmp_path: Path) -> None:
    """Steps longer than the window are reported as unsupported draws; the wrapping steps below it
    still fail (a loud refusal no longer hides the silent bug)."""
    run = conformance("examples.ring_buffer_bugs:REFUSES_LONG_STEPS", *CATCHING, cwd=tmp_path, profile="mutants")
    assert run.returncode == 1, run.output[-4000:]
    caps = run.report["by_capability"]
    assert caps["attention"]["counts"]["failed"] == 1, caps
    assert run.report["totals"]["unsupported_draws"] > 0, run.report["totals"]
