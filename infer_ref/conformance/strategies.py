"""Bounded Hypothesis strategies for KV caches, masks, RoPE and small models.

Every strategy has hard upper bounds (the module constants) so that one example runs in
milliseconds on a CPU and a whole property tier fits a CI budget; widen them with the ``nightly``
profile's larger example counts rather than larger sizes. The bounds are chosen so that the
features under test are still exercised: GQA ratios above 1, several layers and batch rows,
sliding windows of 4-8 crossed several times by the drawn sequences, positions drawn on and
either side of multiples of the window.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass
from typing import Any

import torch
from hypothesis import strategies as st

from infer_ref.config import RopeConfig
from infer_ref.conformance.checkpoints.snapshots import tiny_config

MAX_LAYERS = 4
MAX_BATCH = 3
MAX_KV_HEADS = 4
GQA_RATIOS = (1, 2, 4)
HEAD_DIMS = (2, 4, 8, 16)
MAX_SEQ = 48  # cache capacity / prompt length bound for cache- and attention-level properties
MAX_WINDOW = 12
MODEL_WINDOWS = (4, 5, 6, 8)  # Gemma windows for model-level properties: small, so sequences cross them
MAX_DECODE_STEPS = 16


@dataclass(frozen=True)
class CacheDims:
    """Geometry drawn for a cache: K/V entries are ``[batch_size, num_kv_heads, T, head_dim]``;
    ``num_heads = num_kv_heads * groups`` query heads share them (GQA)."""

    num_layers: int
    batch_size: int
    num_kv_heads: int
    groups: int
    head_dim: int

    @property
    def num_heads(self) -> int:
        return self.num_kv_heads * self.groups


def cache_dims(
    max_layers: int = MAX_LAYERS, max_batch: int = MAX_BATCH, max_kv_heads: int = MAX_KV_HEADS
) -> st.SearchStrategy[CacheDims]:
    """Layers 1..4, batch 1..3, kv heads 1..4, GQA ratio 1/2/4, even head_dim 2..16."""
    return st.builds(
        CacheDims,
        num_layers=st.integers(1, max_layers),
        batch_size=st.integers(1, max_batch),
        num_kv_heads=st.integers(1, max_kv_heads),
        groups=st.sampled_from(GQA_RATIOS),
        head_dim=st.sampled_from(HEAD_DIMS),
    )


def dtypes(low_precision: bool = True) -> st.SearchStrategy[torch.dtype]:
    """Cache dtypes: float64 and float32, plus bfloat16 and float16 unless ``low_precision=False``."""
    choices = [torch.float64, torch.float32]
    if low_precision:
        choices += [torch.bfloat16, torch.float16]
    return st.sampled_from(choices)


def prompt_lengths(min_len: int = 1, max_len: int = MAX_SEQ) -> st.SearchStrategy[int]:
    return st.integers(min_len, max_len)


def decode_steps(max_steps: int = MAX_DECODE_STEPS) -> st.SearchStrategy[int]:
    return st.integers(1, max_steps)


@st.composite
def chunkings(draw: st.DrawFn, total: int, max_chunks: int | None = None) -> list[int]:
    """A split of ``total`` positions into consecutive chunks (positive sizes summing to ``total``).

    Shrinks towards one chunk (a plain prefill). Runs of size-1 chunks are decode steps; a chunk
    larger than 1 after the first is a chunked-prefill / multi-token verify step.
    """
    if total <= 1:
        return [total]
    limit = total - 1 if max_chunks is None else min(total - 1, max_chunks - 1)
    cuts = draw(st.sets(st.integers(1, total - 1), max_size=limit))
    bounds = [0, *sorted(cuts), total]
    return [b - a for a, b in itertools.pairwise(bounds)]


@st.composite
def prefill_then_decode(draw: st.DrawFn, total: int) -> list[int]:
    """A prompt chunk followed by single-token decode steps, ``sum == total``."""
    prompt = draw(st.integers(1, total))
    return [prompt] + [1] * (total - prompt)


def windows(max_window: int = MAX_WINDOW) -> st.SearchStrategy[int | None]:
    """A sliding window 1..max_window, or None (full causal attention)."""
    return st.one_of(st.none(), st.integers(1, max_window))


@st.composite
def positions_near_window(draw: st.DrawFn, window: int, max_multiple: int = 3) -> int:
    """A position on or next to a multiple of ``window`` (``k*window - 1``, ``k*window``, ``k*window + 1``),
    where off-by-one and missing-window bugs first show; sometimes any position up to the bound."""
    k = draw(st.integers(0, max_multiple))
    near = max(0, k * window + draw(st.integers(-1, 1)))
    return draw(st.one_of(st.just(near), st.integers(0, (max_multiple + 1) * window)))


@st.composite
def mask_cases(draw: st.DrawFn, max_window: int = MAX_WINDOW) -> tuple[int, int, int | None]:
    """``(q_len, start, window)`` with start and start+q_len landing around window boundaries."""
    window = draw(windows(max_window))
    w = window or draw(st.integers(1, max_window))
    start = draw(positions_near_window(w))
    q_len = draw(st.one_of(st.just(1), st.sampled_from([max(1, w - 1), w, w + 1]), st.integers(1, 3 * w)))
    return q_len, start, window


@st.composite
def llama3_ropes(draw: st.DrawFn) -> tuple[int, RopeConfig]:
    """``(head_dim, RopeConfig)`` with llama3 scaling whose three bands (keep, smooth, divide) are all
    likely populated: the original context is drawn within the range of the wavelengths."""
    head_dim = draw(st.sampled_from([8, 16, 32, 64]))
    theta = draw(st.sampled_from([10_000.0, 500_000.0]))
    low = draw(st.sampled_from([1.0, 2.0]))
    high = draw(st.sampled_from([4.0, 8.0]))
    orig = draw(st.sampled_from([16, 32, 64, 256, 1024]))
    factor = draw(st.sampled_from([2.0, 8.0, 32.0]))
    return head_dim, RopeConfig(
        theta=theta,
        rope_type="llama3",
        factor=factor,
        low_freq_factor=low,
        high_freq_factor=high,
        original_max_position_embeddings=orig,
    )


def ropes() -> st.SearchStrategy[tuple[int, RopeConfig]]:
    """``(head_dim, RopeConfig)``: default, linear or llama3 scaling."""
    plain = st.builds(
        lambda d, theta: (d, RopeConfig(theta=theta)),
        st.sampled_from([4, 8, 16, 32]),
        st.sampled_from([10_000.0, 1_000_000.0]),
    )
    linear = st.builds(
        lambda d, f: (d, RopeConfig(theta=10_000.0, rope_type="linear", factor=f)),
        st.sampled_from([8, 16]),
        st.sampled_from([2.0, 4.0]),
    )
    return st.one_of(plain, linear, llama3_ropes())


# -- model configs -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelCase:
    """A drawn small checkpoint: its HF config dict and the weight seed."""

    family: str
    hf_config: dict[str, Any]
    seed: int

    @property
    def window(self) -> int | None:
        if self.family != "gemma3_text":
            return None
        return int(self.hf_config["sliding_window"])

    def describe(self) -> str:
        keys = (
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "hidden_size",
            "sliding_window",
            "layer_types",
            "query_pre_attn_scalar",
            "tie_word_embeddings",
        )
        shown = {k: self.hf_config[k] for k in keys if k in self.hf_config}
        return f"{self.family} seed={self.seed} {shown}"


@st.composite
def model_configs(draw: st.DrawFn, family: str) -> ModelCase:
    """A random small config of ``family`` (HF config.json format) and a weight seed.

    Varies depth (1-3 layers, Gemma 2-4), kv heads (1-2), GQA ratio (1, 2), head_dim (8-32),
    tied / untied head; Llama keeps llama3 RoPE scaling with an original context (16-64) short
    enough that all three frequency bands occur; Gemma draws a window of 4-8, a layer pattern with
    both sliding and global layers, and a ``query_pre_attn_scalar`` different from head_dim.
    EOS ids are set outside the vocabulary so that generation is never cut short by chance.
    """
    cfg = copy.deepcopy(tiny_config(family))
    kv_heads = draw(st.sampled_from([1, 2]))
    groups = draw(st.sampled_from([1, 2]))
    head_dim = draw(st.sampled_from([8, 16, 32]))
    cfg.update(
        vocab_size=draw(st.sampled_from([64, 96])),
        hidden_size=draw(st.sampled_from([32, 64])),
        intermediate_size=64,
        num_attention_heads=kv_heads * groups,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        tie_word_embeddings=draw(st.booleans()),
        eos_token_id=[10_000],
        max_position_embeddings=256,
    )
    if family == "gemma3_text":
        layers = draw(st.integers(2, 4))
        types = draw(
            st.lists(st.sampled_from(["sliding_attention", "full_attention"]), min_size=layers, max_size=layers).filter(
                lambda t: len(set(t)) == 2
            )
        )
        cfg.update(
            num_hidden_layers=layers,
            layer_types=types,
            sliding_window=draw(st.sampled_from(MODEL_WINDOWS)),
            query_pre_attn_scalar=draw(st.sampled_from([s for s in (6, 12, 24, 40) if s != head_dim])),
            pad_token_id=0,
        )
    else:
        cfg.update(num_hidden_layers=draw(st.integers(1, 3)))
    if family == "llama":
        cfg["rope_parameters"] = dict(
            cfg["rope_parameters"],
            original_max_position_embeddings=draw(st.sampled_from([16, 32, 64])),
            factor=draw(st.sampled_from([4.0, 8.0])),
        )
    seed = draw(st.integers(0, 2**16))
    return ModelCase(family=family, hf_config=cfg, seed=seed)


@st.composite
def token_ids(draw: st.DrawFn, vocab_size: int, batch_size: int, length: int) -> torch.Tensor:
    """``[batch_size, length]`` int64 ids below ``vocab_size`` (from a drawn seed: cheap to shrink)."""
    seed = draw(st.integers(0, 2**16))
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (batch_size, length), generator=generator)


def sequence_lengths(case: ModelCase, max_len: int = 24) -> st.SearchStrategy[int]:
    """Sequence lengths for a model case: for Gemma, up to ``4 * window + 2`` so that sequences
    cross the window several times, with the boundary lengths themselves preferred."""
    w = case.window
    if w is None:
        return st.integers(1, max_len)
    return st.one_of(st.sampled_from([w, w + 1, 2 * w + 1, 3 * w + 2]), st.integers(1, 4 * w + 2))


__all__ = [
    "CacheDims",
    "ModelCase",
    "cache_dims",
    "chunkings",
    "decode_steps",
    "dtypes",
    "llama3_ropes",
    "mask_cases",
    "model_configs",
    "positions_near_window",
    "prefill_then_decode",
    "prompt_lengths",
    "ropes",
    "sequence_lengths",
    "token_ids",
    "windows",
]


# -- low-precision, sampler and stopping tiers ---------------------------------------------------

LOW_DTYPES = (torch.bfloat16, torch.float16)
MAX_ROPE_POSITION = 8192  # positions in the thousands: an angle error grows with the position


def low_dtypes() -> st.SearchStrategy[torch.dtype]:
    """bfloat16 or float16: the dtypes whose rounding the low-precision tier checks."""
    return st.sampled_from(LOW_DTYPES)


@st.composite
def far_norm_weights(draw: st.DrawFn, dim: int, gemma: bool) -> torch.Tensor:
    """A norm weight ``[dim]`` far from 0 and 1, where rounding ``w`` or ``1 + w`` shows: magnitudes
    1.25-3.5 with random signs (Gemma stores ``w`` with ``1 + w`` applied: 0.6-2.5, so ``1 + w`` is
    1.6-3.5, whose bf16 spacing is coarser than ``w``'s)."""
    seed = draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    if gemma:
        return 0.6 + 1.9 * torch.rand(dim, generator=g)
    sign = torch.where(torch.rand(dim, generator=g) < 0.5, -1.0, 1.0)
    return sign * (1.25 + 2.25 * torch.rand(dim, generator=g))


@st.composite
def hidden_states(draw: st.DrawFn, rows: int, dim: int, dtype: torch.dtype) -> torch.Tensor:
    """``[1, rows, dim]`` activations in ``dtype`` with a drawn scale (0.05-40) and a few outliers:
    the squares of such rows lose bits when accumulated in bf16."""
    seed = draw(st.integers(0, 2**16))
    scale = draw(st.sampled_from([0.05, 1.0, 7.0, 40.0]))
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, rows, dim, generator=g) * scale
    x[..., :: max(1, dim // 4)] *= 4.0
    return x.to(dtype)


@st.composite
def rope_positions(draw: st.DrawFn, max_position: int = MAX_ROPE_POSITION) -> torch.Tensor:
    """``[T]`` int64 absolute positions: a few small ones and several in the thousands."""
    small = draw(st.lists(st.integers(0, 64), min_size=1, max_size=4))
    large = draw(st.lists(st.integers(1000, max_position), min_size=2, max_size=8))
    return torch.tensor(sorted(set(small + large)), dtype=torch.int64)


@st.composite
def sampler_logits(draw: st.DrawFn, min_vocab: int = 4, max_vocab: int = 48) -> torch.Tensor:
    """``[V]`` float64 logits; two times in three drawn from a few levels, so that ties sit at the
    top-k and top-p boundaries."""
    vocab = draw(st.integers(min_vocab, max_vocab))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    if draw(st.sampled_from(["levels", "continuous", "levels"])) == "levels":
        levels = torch.tensor(draw(st.lists(st.sampled_from([-3.0, -1.0, 0.0, 0.5, 1.0, 2.0, 4.0]), min_size=2, max_size=4, unique=True)))
        return levels[torch.randint(0, len(levels), (vocab,), generator=g)].double()
    return (torch.randn(vocab, generator=g, dtype=torch.float64) * draw(st.sampled_from([0.5, 2.0, 5.0])))


@st.composite
def sampler_specs(draw: st.DrawFn, vocab: int) -> Any:
    """A :class:`~infer_ref.conformance.interface.adapter.SamplerSpec`: temperature 0.3-2.5, top-k (None or
    1..V), top-p (None or 0.05-0.99), repetition penalty (1, below or above 1)."""
    from infer_ref.conformance.interface.adapter import SamplerSpec

    return SamplerSpec(
        temperature=draw(st.sampled_from([0.3, 0.7, 1.0, 1.5, 2.5])),
        top_k=draw(st.one_of(st.none(), st.integers(1, vocab))),
        top_p=draw(st.one_of(st.none(), st.sampled_from([0.05, 0.3, 0.5, 0.8, 0.9, 0.99]))),
        repetition_penalty=draw(st.sampled_from([1.0, 0.8, 1.3, 2.0])),
    )


def sampler_contexts(vocab: int) -> st.SearchStrategy[list[int]]:
    """Token ids seen so far (prompt + generated), for the repetition penalty: 1-12 ids, repeats allowed."""
    return st.lists(st.integers(0, vocab - 1), min_size=1, max_size=12)
