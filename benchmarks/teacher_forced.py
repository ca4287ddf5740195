"""Teacher-forced decode runs: every path is fed one token sequence; each step's next-token logits are kept.

The sequence is the prompt plus the tokens a float32 reference picks greedily
(:func:`float32_reference`). Feeding the reference's own continuation makes the comparison the
same for every path (no path is compared on tokens it chose itself) and makes "the reference's
token" at each step the token fed next. Rows are kept for the decode steps only (the N-1 steps
after the prefill, the steps a decode tokens/s figure times): row ``i`` is the distribution of new
token ``i + 1`` after the path was fed new token ``i``.

A path is anything with ``prefill(prompt [1, T]) -> logits [V]`` and ``step(token) -> logits [V]``
(:class:`EagerPath`, :class:`FastPath`, :class:`TransformersPath`).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from benchmarks.accuracy import Agreement, agreement
from infer_ref.cache.contiguous import KVCache
from infer_ref.config import ModelConfig
from infer_ref.conformance.oracles.transformers_cache import cache_keyword
from infer_ref.engine import FastDecoder


class TeacherForcedPath(Protocol):
    def prefill(self, prompt: Tensor) -> Tensor: ...

    def step(self, token: int) -> Tensor: ...


@dataclasses.dataclass(frozen=True)
class Reference:
    """The float32 reference's greedy continuation of a prompt and its logits at each decode step.

    ``new_tokens`` holds the N tokens it picked; ``logits`` ``[N-1, V]`` (float32) row ``i`` is the
    distribution of ``new_tokens[i + 1]`` after feeding ``new_tokens[i]``.
    """

    prompt: Tensor  # [1, T]
    new_tokens: list[int]
    logits: Tensor  # [N-1, V]

    @property
    def fed(self) -> list[int]:
        """The tokens fed at the decode steps (all but the last new token)."""
        return self.new_tokens[:-1]

    @property
    def targets(self) -> Tensor:
        """The reference's token at each decode step ``[N-1]`` (what each row is scored on)."""
        return torch.tensor(self.new_tokens[1:], dtype=torch.long, device=self.logits.device)


class EagerPath:
    """infer_ref's eager forward with a contiguous ``KVCache`` of ``capacity`` positions."""

    def __init__(self, model: nn.Module, capacity: int) -> None:
        self.model, self.capacity = model, capacity
        self.cache: KVCache | None = None
        self.device = torch.device("cpu")

    @torch.inference_mode()
    def prefill(self, prompt: Tensor) -> Tensor:
        dtype = next(self.model.parameters()).dtype
        self.device = prompt.device
        config: ModelConfig = self.model.config  # type: ignore[assignment]
        self.cache = KVCache.from_model_config(config, self.capacity, dtype=dtype, device=prompt.device)
        return self.model(prompt, kv_cache=self.cache)[0, -1]  # [V]

    @torch.inference_mode()
    def step(self, token: int) -> Tensor:
        ids = torch.tensor([[token]], device=self.device)  # [1, 1]
        return self.model(ids, kv_cache=self.cache)[0, -1]  # [V]


class FastPath:
    """A ``FastDecoder`` (captured, compiled or paged step): ``prefill``, then ``set_input`` + ``step``."""

    def __init__(self, decoder: FastDecoder) -> None:
        self.decoder = decoder

    def prefill(self, prompt: Tensor) -> Tensor:
        self.decoder.reset()
        return self.decoder.prefill(prompt)[0, -1]

    def step(self, token: int) -> Tensor:
        self.decoder.set_input([token])
        return self.decoder.step()[0, -1]  # a graph-owned buffer: copied by the caller before the next step


class TransformersPath:
    """A transformers causal LM with a ``DynamicCache``; the prefill projects only its last position."""

    def __init__(self, hf: nn.Module) -> None:
        self.hf = hf
        self.device = next(hf.parameters()).device
        self.cache: Any = None
        self.keyword = cache_keyword(hf)  # past_key_values or cache, as the installed transformers names it

    @torch.inference_mode()
    def prefill(self, prompt: Tensor) -> Tensor:
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.hf.config)  # type: ignore[arg-type]
        out = self.hf(input_ids=prompt, use_cache=True, logits_to_keep=1, **{self.keyword: self.cache})
        return out.logits[0, -1]

    @torch.inference_mode()
    def step(self, token: int) -> Tensor:
        ids = torch.tensor([[token]], device=self.device)
        return self.hf(input_ids=ids, use_cache=True, **{self.keyword: self.cache}).logits[0, -1]


def decode_rows(path: TeacherForcedPath, prompt: Tensor, fed: list[int]) -> Tensor:
    """float32 logits ``[len(fed), V]``: the path's next-token logits after each fed token."""
    path.prefill(prompt)
    with torch.inference_mode():
        return torch.stack([path.step(token).to(torch.float32, copy=True) for token in fed])  # copies: a graph reuses its buffer


def path_agreement(path: TeacherForcedPath, reference: Reference) -> Agreement:
    """The path's agreement with ``reference`` on the reference's sequence (see :mod:`benchmarks.accuracy`)."""
    rows = decode_rows(path, reference.prompt, reference.fed)
    return agreement(reference.logits, rows, reference.targets)


def float32_copy(model: nn.Module) -> nn.Module:
    """One float32 copy of ``model``'s weights (tied tensors stay tied); free it when done."""
    return copy.deepcopy(model).to(torch.float32)


@torch.inference_mode()
def float32_reference(model32: nn.Module, prompt: Tensor, new_tokens: int) -> Reference:
    """Greedy-decode ``new_tokens`` (>= 2) tokens with ``model32`` and a float32 ``KVCache``; keep the decode rows.

    The cache holds float32 K/V exactly as a full recompute would compute them; cached and
    uncached float32 logits differ by reduction order only (~1e-6), far below the bf16 differences
    measured, and a recompute per step would cost a full prefill of the context per token.
    """
    if new_tokens < 2:
        raise ValueError(f"new_tokens must be >= 2 (one decode step after the prefill's token), got {new_tokens}")
    path = EagerPath(model32, prompt.shape[1] + new_tokens)
    tokens = [int(path.prefill(prompt).argmax())]
    rows = []
    for _ in range(new_tokens - 1):
        logits = path.step(tokens[-1]).float()
        rows.append(logits)
        tokens.append(int(logits.argmax()))
    return Reference(prompt=prompt, new_tokens=tokens, logits=torch.stack(rows))
