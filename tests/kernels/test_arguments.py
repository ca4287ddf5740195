"""The entry points written over one argument object (``infer_ref/fast/kernels/arguments.py``):
each takes its family's declared argument list (the dataclass or its constructor), positional or by
name, then its own knobs; a call that does not fit is refused naming the entry point."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest
import torch

from infer_ref.fast.kernels import gemv
from infer_ref.fast.kernels.arguments import takes_arguments_of
from infer_ref.fast.kernels.attention import (
    AttentionCall,
    LaunchKnobs,
    check_decode_args,
    check_decode_attention_args,
    decode_attention,
    decode_attention_reference,
    decode_attention_triton,
    paged_decode_attention,
    paged_decode_attention_reference,
    paged_decode_attention_triton,
)
from infer_ref.fast.kernels.attention import launch as attention_launch

FIELDS = [field.name for field in dataclasses.fields(AttentionCall)]
PAGED = ["q", "k_cache", "v_cache", "block_tables", "seq_lens", "scale", "window"]


def _names(fn: Any) -> list[str]:
    return list(inspect.signature(fn).parameters)


@pytest.mark.parametrize("fn", [check_decode_attention_args, decode_attention, decode_attention_reference])
def test_decode_entry_points_take_the_call_fields(fn: Any) -> None:
    assert _names(fn) == FIELDS


@pytest.mark.parametrize("fn", [check_decode_args, paged_decode_attention, paged_decode_attention_reference])
def test_paged_entry_points_take_the_paged_arguments(fn: Any) -> None:
    assert _names(fn) == PAGED


def test_launchers_take_the_call_then_their_knobs() -> None:
    knobs = ["num_splits", "block_n", "num_warps", "num_stages", "out", "first_n", "preload", "heads_per_program"]
    assert _names(decode_attention_triton) == FIELDS + knobs
    assert _names(paged_decode_attention_triton) == [*PAGED, "num_splits", "block_n", "num_warps", "num_stages"]
    linear = ["x", "weight", "bias", "out", "in_norm", "residual", "out_norm", "weight_is_constant", "residual_is_settled"]
    assert _names(gemv.linear) == _names(gemv.check_linear_args) == linear
    assert _names(gemv.linear_triton) == [*linear, "config"]
    gated = ["x", "weight", "act", "out", "in_norm", "weight_is_constant"]
    assert _names(gemv.gated_mlp) == _names(gemv.check_gated_args) == gated
    assert _names(gemv.gated_mlp_triton) == [*gated, "config"]


def _attention_args() -> dict[str, Any]:
    b, h, hkv, d, bs = 2, 4, 2, 16, 4
    return {
        "q": torch.randn(b, h, d), "k": torch.randn(b, hkv, d), "v": torch.randn(b, hkv, d), "cos": None, "sin": None,
        "k_cache": torch.zeros(8, bs, hkv, d), "v_cache": torch.zeros(8, bs, hkv, d),
        "block_tables": torch.arange(8, dtype=torch.int32).view(b, 4), "seq_lens": torch.tensor([3, 5]), "scale": 0.25,
    }  # fmt: skip


def test_a_launcher_routes_positional_and_named_knobs(monkeypatch: pytest.MonkeyPatch) -> None:
    """The 14th positional argument is ``num_splits`` (after the call's 13), the rest by name; the call
    itself reaches the launch whole, arguments given by name included."""
    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(attention_launch, "launch", lambda *a: calls.append(a) or a[0].q)
    a = _attention_args()
    positional = [a[name] for name in FIELDS[:10]]
    decode_attention_triton(*positional, 3, None, None, 5, block_n=32, preload=True)
    decode_attention_triton(**a, window=7, num_splits=2, first_n=64)
    (first, first_knobs, _), (second, second_knobs, _) = calls  # launch(call, knobs, out)
    assert first.window == 3 and first.q_norm is None and first_knobs == LaunchKnobs(5, 32, preload=True)
    assert second.window == 7 and second_knobs == LaunchKnobs(num_splits=2, first_n=64)
    assert all(getattr(first, name) is a[name] for name in FIELDS[:10])


def test_a_call_that_does_not_fit_names_the_entry_point() -> None:
    a = _attention_args()
    del a["scale"]
    with pytest.raises(TypeError, match=r"^decode_attention_reference\(\): missing a required argument: 'scale'$"):
        decode_attention_reference(**a)
    with pytest.raises(TypeError, match=r"^decode_attention_triton\(\): missing a required argument: 'scale'$"):
        decode_attention_triton(**a, num_splits=2)
    with pytest.raises(TypeError, match=r"^linear\(\): too many positional arguments$"):
        gemv.linear(torch.ones(1, 4), torch.ones(2, 4), None, None)


def test_the_arguments_own_errors_pass_unchanged() -> None:
    """A TypeError of the entry point itself (a check) is not mistaken for arguments that do not fit."""

    @takes_arguments_of(AttentionCall.paged)
    def refuse(call: AttentionCall) -> None:
        raise TypeError("refused by the entry point")

    a = _attention_args()
    with pytest.raises(TypeError, match="^refused by the entry point$"):
        refuse(*(a[name] for name in PAGED[:6]))
