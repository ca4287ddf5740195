"""Building blocks shared by the three families: norms, RoPE, masks, attention, MLP, the decoder skeleton.

Numerics follow transformers exactly where it matters for bit-level agreement: RMSNorm normalises
in fp32, RoPE tables are computed in fp32 and cast to the activation dtype, rotate_half splits the
head in halves. In float64 nothing is rounded to fp32: norms, frequencies and angles are float64
(the definition; transformers' fp32 casts are lifted by the kit's float64 oracle). Shapes: B batch, T new tokens, S keys visible (cache length after the write),
H query heads, Hkv key/value heads, D head_dim, E hidden size, V vocab.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from infer_ref.activations import ACTIVATIONS
from infer_ref.attention import HeadTransform, cached_attention
from infer_ref.cache.contiguous import KVCacheOverflowError
from infer_ref.cache.protocol import KVCacheProtocol, plan_step
from infer_ref.config import ModelConfig, RopeConfig
from infer_ref.norm import NormSpec, rms_norm
from infer_ref.rotary import apply_rope as apply_rope
from infer_ref.rotary import apply_rope_to_pair as apply_rope_to_pair
from infer_ref.rotary import rotate_half as rotate_half
from infer_ref.step import Step
from infer_ref.validation import check_token_ids

# -- norms ---------------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    """Llama/Qwen RMSNorm: normalise in fp32, cast back, then multiply by the weight."""

    unit_offset = False  # the formula, as infer_ref/norm.py names it

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps, unit_offset=self.unit_offset)

    @property
    def spec(self) -> NormSpec:
        """This norm as the fused kernels take it (weight, eps, formula)."""
        return NormSpec(self.weight, self.eps, self.unit_offset)


class GemmaRMSNorm(RMSNorm):
    """Gemma RMSNorm: ``(norm(x) * (1 + w))`` entirely in fp32, cast back last; weight stored as offset from 1."""

    unit_offset = True

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__(dim, eps)
        self.weight = nn.Parameter(torch.zeros(dim))


NormFactory = Callable[[int, float], nn.Module]

# -- rotary embeddings ---------------------------------------------------------------------------


def rope_inv_freq(head_dim: int, rope: RopeConfig, dtype: torch.dtype = torch.float32) -> Tensor:
    """Inverse frequencies ``[D/2]`` computed in ``dtype`` (fp32, as transformers; float64 for the
    float64 model), with linear or llama3 scaling applied. Always on the CPU (a model built on meta
    computes them there: arithmetic on meta tensors imports ``torch._dynamo``, 1.5 s); callers move
    the result where the model lives."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").to(dtype) / head_dim
    inv_freq = 1.0 / (rope.theta**exponents)
    if rope.rope_type == "linear":
        return inv_freq / rope.factor
    if rope.rope_type == "llama3":
        return _llama3_scaled(inv_freq, rope)
    return inv_freq


def _llama3_scaled(inv_freq: Tensor, rope: RopeConfig) -> Tensor:
    """Llama 3.1 scaling: long wavelengths divided by ``factor``, short kept, a smooth band between."""
    assert rope.original_max_position_embeddings is not None
    old_context = rope.original_max_position_embeddings
    low_freq_wavelen = old_context / rope.low_freq_factor
    high_freq_wavelen = old_context / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_context / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


class RotaryEmbedding(nn.Module):
    """cos/sin tables for arbitrary absolute positions: computed in fp32 then cast (transformers'
    rounding) for an activation dtype up to fp32; in float64 throughout for float64."""

    inv_freq: Tensor
    inv_freq64: Tensor

    def __init__(self, head_dim: int, rope: RopeConfig) -> None:
        super().__init__()
        self.head_dim = head_dim
        self.rope = rope
        here = torch.get_default_device()  # meta while the loader builds the model
        self.register_buffer("inv_freq", rope_inv_freq(head_dim, rope).to(here), persistent=False)
        self.register_buffer("inv_freq64", rope_inv_freq(head_dim, rope, torch.float64).to(here), persistent=False)

    def reset_buffers(self, device: torch.device | str) -> None:
        """Recompute ``inv_freq`` and ``inv_freq64`` from ``self.rope`` (after a meta-device
        construction, or a changed ``rope``) on ``device``."""
        self.inv_freq = rope_inv_freq(self.head_dim, self.rope).to(device)
        self.inv_freq64 = rope_inv_freq(self.head_dim, self.rope, torch.float64).to(device)

    def forward(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos/sin ``[T, D]`` for positions ``[T]`` (or ``[B, T, D]`` for per-row positions ``[B, T]``)."""
        if dtype == torch.float64:
            freqs = positions[..., None].double() * self.inv_freq64.double()  # [..., T, D/2]
        else:
            freqs = positions[..., None].float() * self.inv_freq.float()  # [..., T, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [..., T, D]
        return emb.cos().to(dtype), emb.sin().to(dtype)


# -- attention and MLP ---------------------------------------------------------------------------


# cuDNN's SDPA builds an execution plan per key length: in decode, where the length grows by one
# every step, that costs ~3 ms of host time per layer (measured on an H100, 70 ms per Llama-1B
# step). Every other backend is allowed; on CPU only MATH and the CPU flash kernel apply anyway.
SDPA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
# A static-shape cache has one key length, so cuDNN plans once; with the [T, S_max] mask it needs,
# cuDNN is the fastest backend measured (H100, Llama-1B decode at S_max 256: 13 us per layer,
# mem-efficient 21 us; flash takes no boolean mask). Listed first: tried first.
STATIC_SDPA_BACKENDS = [SDPBackend.CUDNN_ATTENTION, *SDPA_BACKENDS]


class Normed(NamedTuple):
    """A sub-layer's input ``norm(x)``, left for the projection that reads it to compute.

    The reference projection calls ``norm(x)`` first (:meth:`evaluate`: the module itself, so its
    exact code runs); a kernel-backed projection (``infer_ref/fast/modules.py``) normalises each tile
    of ``x`` as it reads it instead (the norm's ``spec``), which saves the norm its own kernel.
    """

    norm: RMSNorm
    x: Tensor

    def evaluate(self) -> Tensor:
        return self.norm(self.x)


ProjectionInput = Tensor | Normed


class DecodeLinear(nn.Linear):
    """``nn.Linear`` over a plain or :class:`Normed` input, with the block's residual add folded in.

    ``forward(x, residual=r, out_norm=n)`` is ``r + n(x @ W^T + b)`` (each part optional), rounded
    step by step as eager torch rounds: ``F.linear`` and the modules themselves. The calling
    convention lets a kernel-backed subclass (``infer_ref/fast/modules.py``) compute all of it in
    one matrix-vector kernel: the input norm in its prologue, the residual (and output norm) in
    its epilogue.
    """

    def forward(
        self, x: ProjectionInput, *, residual: Tensor | None = None, out_norm: RMSNorm | None = None
    ) -> Tensor:
        y = F.linear(x.evaluate() if isinstance(x, Normed) else x, self.weight, self.bias)
        if out_norm is not None:
            y = out_norm(y)
        return y if residual is None else residual + y


class PackedLinear(DecodeLinear):
    """Several checkpoint projections of one input stacked by rows into one matrix.

    ``parts`` maps each checkpoint module name (``q_proj``, ...) to its number of output rows, in
    stacking order. One GEMM then reads all of them: a decode step is a few large matrix-vector
    products rather than many small ones. The loader stacks the checkpoint's tensors
    (``infer_ref/loader.py``); :meth:`split` cuts the output back into the parts.
    """

    def __init__(self, in_features: int, parts: dict[str, int], bias: bool) -> None:
        super().__init__(in_features, sum(parts.values()), bias=bias)
        self.parts = dict(parts)

    def split(self, y: Tensor) -> tuple[Tensor, ...]:
        """``[..., sum(rows)]`` -> one view ``[..., rows]`` per part, in stacking order."""
        return y.split(list(self.parts.values()), dim=-1)


class Attention(nn.Module):
    """Grouped-query attention with optional per-head QK-norm, RoPE, and an explicit KV cache.

    ``forward(x, cos, sin, step, kv_cache, layer_idx, residual=r, out_norm=n)`` returns
    ``r + n(attention(x))``: the block's residual add (and Gemma's post-attention norm) ride on the
    output projection. ``step`` (:class:`~infer_ref.step.Step`) says which keys the new tokens see.
    """

    def __init__(self, config: ModelConfig, qk_norm: NormFactory | None) -> None:
        super().__init__()
        e, d = config.hidden_size, config.computed_head_dim
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = d
        self.scale = config.attention_scale
        bias = config.attention_bias
        q_rows, kv_rows = self.num_heads * d, self.num_kv_heads * d
        self.qkv_proj = PackedLinear(e, {"q_proj": q_rows, "k_proj": kv_rows, "v_proj": kv_rows}, bias=bias)
        self.o_proj = DecodeLinear(self.num_heads * d, e, bias=bias)
        self.q_norm = qk_norm(d, config.rms_norm_eps) if qk_norm else None
        self.k_norm = qk_norm(d, config.rms_norm_eps) if qk_norm else None

    def forward(
        self,
        x: ProjectionInput,
        cos: Tensor,
        sin: Tensor,
        step: Step,
        kv_cache: KVCacheProtocol | None = None,
        layer_idx: int = 0,
        *,
        residual: Tensor | None = None,
        out_norm: RMSNorm | None = None,
    ) -> Tensor:
        b, t, _ = (x.x if isinstance(x, Normed) else x).shape
        q, k, v = self.qkv_proj.split(self.qkv_proj(x))  # [B, T, H*D], [B, T, Hkv*D] x 2
        q = q.view(b, t, self.num_heads, self.head_dim).transpose(1, 2)  # [B, H, T, D]
        k = k.view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)  # [B, Hkv, T, D]
        v = v.view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)  # [B, Hkv, T, D]
        transform = HeadTransform(cos, sin, self.q_norm, self.k_norm)
        out = self.attend(q, k, v, transform, step, kv_cache, layer_idx)  # [B, H, T, D]
        out = out.transpose(1, 2).reshape(b, t, self.num_heads * self.head_dim)  # [B, T, H*D]
        return self.o_proj(out, residual=residual, out_norm=out_norm)

    def attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        transform: HeadTransform,
        step: Step,
        kv_cache: KVCacheProtocol | None,
        layer_idx: int,
    ) -> Tensor:
        """q ``[B, H, T, D]`` and k/v ``[B, Hkv, T, D]`` as projected -> ``[B, H, T, D]``: per-head
        norms and RoPE (V is never rotated), the cache write, attention with the step's mask.
        A fast path's subclass may fuse all of it into one kernel (``infer_ref/fast/attention.py``)."""
        q, k = transform.apply(q, k)
        return cached_attention(kv_cache, layer_idx, q, k, v, step.mask(layer_idx), self.scale)


class MLP(nn.Module):
    """Gated MLP: ``down(act(gate(x)) * up(x))``, gate and up stacked in one matrix.

    ``forward(x, residual=r, out_norm=n)`` returns ``r + n(mlp(x))``, as :class:`Attention` does.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        e, i, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gate_up_proj = PackedLinear(e, {"gate_proj": i, "up_proj": i}, bias=bias)
        self.down_proj = DecodeLinear(i, e, bias=bias)
        self.act_name = config.hidden_act
        self.act = ACTIVATIONS[config.hidden_act]

    def forward(
        self, x: ProjectionInput, *, residual: Tensor | None = None, out_norm: RMSNorm | None = None
    ) -> Tensor:
        return self.down_proj(self.gated(x), residual=residual, out_norm=out_norm)  # [B, T, E]

    def gated(self, x: ProjectionInput) -> Tensor:
        """``act(gate(x)) * up(x)`` ``[B, T, I]``."""
        gate, up = self.gate_up_proj.split(self.gate_up_proj(x))  # [B, T, I] each
        return self.act(gate) * up


# -- the decoder skeleton ------------------------------------------------------------------------


class DecoderLM(nn.Module):
    """Embed -> blocks -> final norm -> LM head, with the KV-cache contract of docs/design.md.

    Families provide the blocks (``self.layers``), the norm class, and may override ``embed``.
    Each block is called as ``block(x, cos, sin, step, kv_cache, layer_idx)``.
    """

    layers: nn.ModuleList

    def __init__(self, config: ModelConfig, norm: NormFactory) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.norm = norm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = DecodeLinear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        # One RoPE table per layer type (Gemma 3: 1e4 for sliding layers, 1e6 for global ones).
        self.rotary = nn.ModuleDict(
            {
                layer_type: RotaryEmbedding(config.computed_head_dim, config.rope_for_layer_type(layer_type))
                for layer_type in sorted(set(config.layer_types))
            }
        )

    def embed(self, input_ids: Tensor) -> Tensor:
        return self.embed_tokens(input_ids)  # [B, T, E]

    def forward(
        self,
        input_ids: Tensor,
        kv_cache: KVCacheProtocol | None = None,
        *,
        all_logits: bool = False,
        check_ids: bool = True,
    ) -> Tensor:
        """Logits for ``input_ids`` ``[B, T]``.

        Every id is checked to lie in ``[0, vocab_size)`` first; on a GPU that check reads a
        reduction back (a host sync). ``check_ids=False`` skips it for ids the caller produced on
        the device from this model's own logits (an argmax is in range by construction), so a
        decode loop can enqueue the next step while the GPU still runs this one.

        Without a cache: ``[B, T, V]`` for positions ``0..T-1``. With a cache: the tokens sit at
        the positions the cache's step gives (``seq_len .. seq_len+T-1`` by default), K/V are written there, ``advance(T)`` is called once
        after every layer, and only the last position is projected (``[B, 1, V]``) unless
        ``all_logits`` asks for all T (multi-token verify steps).
        """
        t = self._check_inputs(input_ids, kv_cache, check_ids)
        # The cache decides where the tokens sit and which keys they see, once for every layer
        # (cache/protocol.py): one path for contiguous, static (device-side position), paged and
        # batches of ragged rows.
        step = plan_step(kv_cache, t, self.layer_windows, input_ids.device)
        # A static-shape cache has one key length, so backends that plan per shape plan once.
        backends = STATIC_SDPA_BACKENDS if step.static_shape else SDPA_BACKENDS
        x = self.embed(input_ids)  # [B, T, E]
        tables = {layer_type: rotary(step.positions, x.dtype) for layer_type, rotary in self.rotary.items()}
        with sdpa_kernel(backends, set_priority=True):  # once per forward: the context costs ~10 us of host time
            for i, block in enumerate(self.layers):
                cos, sin = tables[self.config.layer_types[i]]
                x = block(x, cos, sin, step, kv_cache, i)
        if kv_cache is not None:
            kv_cache.advance(t)
            if not all_logits:
                x = x[:, -1:, :]  # RMSNorm is per position: norm(x)[-1] == norm(x[-1])
        return self.logits(self.norm(x))

    def logits(self, x: Tensor) -> Tensor:
        logits = self.lm_head(x)  # [B, T, V]
        cap = self.config.final_logit_softcapping
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def reset_buffers(self, device: torch.device | str) -> None:
        for rotary in self.rotary.values():
            assert isinstance(rotary, RotaryEmbedding)
            rotary.reset_buffers(device)

    def _window(self, layer_type: str) -> int | None:
        return self.config.sliding_window if layer_type == "sliding_attention" else None

    @property
    def layer_windows(self) -> list[int | None]:
        """Each layer's sliding window (None: global), as its attention applies it."""
        return [self._window(layer_type) for layer_type in self.config.layer_types]

    def _check_inputs(self, input_ids: Tensor, kv_cache: KVCacheProtocol | None, check_ids: bool = True) -> int:
        if not isinstance(input_ids, Tensor) or input_ids.dim() != 2 or input_ids.shape[1] == 0:
            shape = tuple(input_ids.shape) if isinstance(input_ids, Tensor) else type(input_ids).__name__
            raise ValueError(f"input_ids must be a [batch, seq_len>=1] tensor, got {shape}")
        if input_ids.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"input_ids must be int64 or int32 token ids, got {input_ids.dtype}")
        if not isinstance(check_ids, bool):
            raise TypeError(f"check_ids must be a bool, got {check_ids!r}")
        if check_ids:
            check_token_ids(input_ids, self.config.vocab_size)  # before any work: no "index out of range"
        t = input_ids.shape[1]
        if kv_cache is None:
            return t
        if kv_cache.num_layers != self.config.num_hidden_layers:
            raise ValueError(
                f"cache has {kv_cache.num_layers} layers, model has {self.config.num_hidden_layers}"
            )
        cache_batch = getattr(kv_cache, "batch_size", input_ids.shape[0])
        if cache_batch != input_ids.shape[0]:
            raise ValueError(f"input batch {input_ids.shape[0]} does not match the cache's batch {cache_batch}")
        if kv_cache.remaining_capacity < t:
            # Checked before any layer writes, so a refused forward leaves the cache untouched.
            raise KVCacheOverflowError(
                f"KV cache overflow: {t} new token(s) at position {kv_cache.seq_len} need capacity "
                f"{kv_cache.seq_len + t}, but max_seq_len is {kv_cache.max_seq_len}"
            )
        return t
