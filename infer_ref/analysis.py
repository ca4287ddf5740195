"""What a KV cache saves and what it costs: FLOPs to generate with and without it, and its bytes.

FLOP counts are exact closed forms for the three decoder families, at 2 FLOPs per multiply-add,
counting only the matrix products (see :func:`flops_comparison` for the list). Memory is the
cache's own tensors: :func:`kv_cache_bytes`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from infer_ref.config import ModelConfig


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def _check_config(config: object) -> ModelConfig:
    if not isinstance(config, ModelConfig):
        raise TypeError(f"config must be a ModelConfig, got {type(config).__name__}")
    return config


def kv_cache_bytes(config: ModelConfig, seq_len: int, dtype: torch.dtype, batch_size: int = 1) -> int:
    """Bytes of a full-length K and V cache: ``2 · layers · batch · kv_heads · seq_len · head_dim · itemsize``.

    Every layer holds ``seq_len`` positions (a contiguous or static cache; a sliding-window layer
    stored as a ring of ``window`` slots would hold fewer).
    """
    config = _check_config(config)
    _check_int("seq_len", seq_len, 0)
    _check_int("batch_size", batch_size, 1)
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype, got {dtype!r}")
    itemsize = torch.empty((), dtype=dtype).element_size()
    per_position = config.num_key_value_heads * config.computed_head_dim * itemsize
    return 2 * config.num_hidden_layers * batch_size * seq_len * per_position


def visible_keys_count(position: int, window: int | None) -> int:
    """Keys a query at 0-based ``position`` attends to: ``position + 1``, at most ``window``."""
    return position + 1 if window is None else min(position + 1, window)


def _visible_keys_sum(length: int, window: int | None) -> int:
    """``Σ_{p < length} visible_keys_count(p, window)`` in closed form."""
    if window is None or length <= window:
        return length * (length + 1) // 2
    return window * (window + 1) // 2 + (length - window) * window


def projection_flops_per_position(config: ModelConfig) -> int:
    """Matrix-product FLOPs of one position through every layer's projections and the LM head.

    Per layer: Q ``hidden × H·D``, K and V ``hidden × Hkv·D`` each (GQA widths), O ``H·D × hidden``,
    and the gated MLP's gate, up (``hidden × intermediate``) and down (``intermediate × hidden``);
    then the LM head ``hidden × vocab`` once. Two FLOPs per multiply-add.
    """
    c = _check_config(config)
    hidden, d = c.hidden_size, c.computed_head_dim
    q_and_o = 2 * hidden * (c.num_attention_heads * d)  # hidden -> H·D and back
    k_and_v = 2 * hidden * (c.num_key_value_heads * d)  # hidden -> Hkv·D, twice
    attention = (q_and_o + k_and_v) * 2
    mlp = 3 * hidden * c.intermediate_size * 2
    return c.num_hidden_layers * (attention + mlp) + hidden * c.vocab_size * 2


def attention_flops_for_query(config: ModelConfig, position: int) -> int:
    """FLOPs of one query position's attention over its visible keys, summed over layers.

    Per layer and query head: ``q·kᵀ`` (``2·D`` per visible key) and ``p·v`` (``2·D`` per visible
    key); a sliding layer sees at most ``window`` keys. GQA shares K/V but not these products.
    """
    c = _check_config(config)
    per_key = 4 * c.num_attention_heads * c.computed_head_dim
    return sum(per_key * visible_keys_count(position, c.window_for_layer(i)) for i in range(c.num_hidden_layers))


def _attention_flops_for_prefix(config: ModelConfig, length: int) -> int:
    """Attention FLOPs of every query position ``0 .. length-1`` (one causal forward)."""
    per_key = 4 * config.num_attention_heads * config.computed_head_dim
    return sum(
        per_key * _visible_keys_sum(length, config.window_for_layer(i)) for i in range(config.num_hidden_layers)
    )


@dataclass(frozen=True)
class FlopsComparison:
    """FLOPs to generate ``n_tokens`` after a ``prompt_len`` prompt, without and with a KV cache."""

    prompt_len: int
    n_tokens: int
    projection_without_cache: int
    attention_without_cache: int
    projection_with_cache: int
    attention_with_cache: int

    @property
    def total_without_cache(self) -> int:
        return self.projection_without_cache + self.attention_without_cache

    @property
    def total_with_cache(self) -> int:
        return self.projection_with_cache + self.attention_with_cache

    @property
    def speedup(self) -> float:
        """``total_without_cache / total_with_cache``: 1.0 for one token, growing with length."""
        return self.total_without_cache / self.total_with_cache


def flops_comparison(prompt_len: int, n_tokens: int, config: ModelConfig) -> FlopsComparison:
    """Total FLOPs to generate ``n_tokens`` tokens after a ``prompt_len`` prompt.

    Token ``i`` (``0 <= i < n_tokens``) is sampled from the logits of position ``prompt_len + i - 1``.

    - **Without a cache**, step ``i`` runs the whole forward over the ``L_i = prompt_len + i``
      positions it has: every position is projected, and every position attends over its visible
      keys (the full causal ``L_i × L_i`` product, less what windows hide).
    - **With a cache**, step 0 is that same forward over the prompt (the prefill); each step
      ``i >= 1`` projects one position, ``prompt_len + i - 1``, which attends over
      ``prompt_len + i`` keys (at most ``window`` on sliding layers).

    Counted (2 FLOPs per multiply-add): the projections of every projected position, per layer Q,
    K, V, O at their GQA widths and the gated MLP's three matrices, plus the LM head on every
    projected position (:func:`projection_flops_per_position`); and the attention products
    ``q·kᵀ`` and ``p·v`` over the visible keys (:func:`attention_flops_for_query`). Not counted:
    embedding lookups, norms, RoPE, activations, softmax, residual adds and sampling (elementwise,
    a small fraction), and any work to write or read the cache itself.
    """
    config = _check_config(config)
    _check_int("prompt_len", prompt_len, 1)
    _check_int("n_tokens", n_tokens, 1)
    per_position = projection_flops_per_position(config)
    lengths = range(prompt_len, prompt_len + n_tokens)  # L_i of the uncached steps
    return FlopsComparison(
        prompt_len=prompt_len,
        n_tokens=n_tokens,
        projection_without_cache=per_position * sum(lengths),
        attention_without_cache=sum(_attention_flops_for_prefix(config, length) for length in lengths),
        projection_with_cache=per_position * (prompt_len + n_tokens - 1),
        attention_with_cache=_attention_flops_for_prefix(config, prompt_len)
        + sum(attention_flops_for_query(config, prompt_len + i - 1) for i in range(1, n_tokens)),
    )


__all__ = [
    "FlopsComparison",
    "attention_flops_for_query",
    "flops_comparison",
    "kv_cache_bytes",
    "projection_flops_per_position",
    "visible_keys_count",
]
