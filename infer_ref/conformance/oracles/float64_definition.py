"""transformers in float64 with its float32 casts lifted: the float64 oracle computes in float64.

transformers rounds to float32 inside a float64 model in two places: every RMSNorm
(``LlamaRMSNorm``/``Qwen3RMSNorm``: ``hidden_states.to(torch.float32)``; ``Gemma3RMSNorm``:
``x.float()`` and ``weight.float()``) and the RoPE tables (inverse frequencies and angles in
float32). Its float64 logits are therefore only float32-accurate: 1e-6 from the definition on the
kit's tiny checkpoints, a thousand times the exact tier's tolerance (docs/conformance.md, "The
float64 oracle"). :func:`lift_float32_casts` gives a loaded float64 model's *instances* (nothing
global is patched) a norm and a rotary forward that compute the same formulas in float64:

- Llama/Qwen norm: ``w * (x * rsqrt(mean(x²) + eps))``; Gemma norm: ``x * rsqrt(mean(x²) + eps) * (1 + w)``;
- RoPE: ``cos/sin(position * inv_freq)`` with the frequencies from their definition in float64
  (:func:`~infer_ref.conformance.oracles.definitions.inv_freq_float64`), checked against
  transformers' own float32 frequencies so that the formula stays transformers' choice.

Everything else (projections, attention through SDPA, the MLP, Gemma's embedding scale, which
transformers builds in the model dtype) already runs in float64. Softmax is float64 under SDPA; the
eager attention's float32 softmax is not used by the oracle.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from infer_ref.config import ModelConfig
from infer_ref.conformance.oracles.definitions import inv_freq_float64

# transformers' float32 frequencies may differ from the float64 definition rounded to float32 by
# the rounding of its own float32 power and division (a few float32 ulps); a different formula
# (scaling dropped or misapplied) differs by far more.
_FREQUENCY_RTOL = 16 * 2.0**-23


def _llama_norm_float64(self: Any, hidden_states: Tensor) -> Tensor:
    """``LlamaRMSNorm``/``Qwen3RMSNorm`` in float64: ``w * (x * rsqrt(mean(x²) + eps))``."""
    x = hidden_states.double()
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)  # [..., E]
    return (self.weight.double() * normed).to(hidden_states.dtype)


def _gemma_norm_float64(self: Any, x: Tensor) -> Tensor:
    """``Gemma3RMSNorm`` in float64: ``x * rsqrt(mean(x²) + eps) * (1 + w)``."""
    x64 = x.double()
    normed = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + self.eps)  # [..., E]
    return (normed * (1.0 + self.weight.double())).to(x.dtype)


def _rotary_float64(self: Any, x: Tensor, position_ids: Tensor, layer_type: str | None = None) -> tuple[Tensor, Tensor]:
    """The rotary module's forward with float64 frequencies and angles (``layer_type``: Gemma 3's
    per-layer-type tables)."""
    prefix = f"{layer_type}_" if layer_type is not None else ""
    inv_freq = self.float64_inv_freq[layer_type or ""].to(x.device)  # [D/2]
    freqs = position_ids[..., None].double() * inv_freq  # [B, T, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)  # [B, T, D]
    scaling = getattr(self, f"{prefix}attention_scaling")
    return (emb.cos() * scaling).to(x.dtype), (emb.sin() * scaling).to(x.dtype)


def _float64_frequencies(rotary: nn.Module, config: ModelConfig) -> dict[str, Tensor]:
    """``{layer type or "": inv_freq [D/2] float64}`` for each float32 table the module holds,
    each checked against it."""
    head_dim = config.computed_head_dim
    tables: dict[str, Tensor] = {}
    for name, buffer in rotary.named_buffers(recurse=False):
        if not name.endswith("inv_freq") or name.endswith("original_inv_freq"):
            continue
        layer_type = name.removesuffix("inv_freq").removesuffix("_")
        rope = config.rope_for_layer_type(layer_type or config.layer_types[0])
        exact = inv_freq_float64(head_dim, rope)
        theirs = buffer.detach().cpu().double()
        if theirs.shape != exact.shape or not torch.allclose(theirs, exact, rtol=_FREQUENCY_RTOL, atol=0.0):
            raise RuntimeError(
                f"float64 oracle: {type(rotary).__name__}.{name} is not the {rope.rope_type} RoPE frequencies "
                f"{rope} of head_dim {head_dim}: max relative difference "
                f"{float(((theirs - exact).abs() / exact).max()) if theirs.shape == exact.shape else 'shape'}"
            )
        tables[layer_type] = exact
    return tables


def lift_float32_casts(model: nn.Module, hf_config: Mapping[str, Any], *, norms: bool = True, rope: bool = True) -> nn.Module:
    """Give a float64 transformers Llama/Qwen3/Gemma 3 model's norm and rotary instances float64
    forwards (module docstring); returns ``model``. A model in another dtype is returned unchanged.
    ``norms`` / ``rope`` False keep transformers' float32 step there (the precision-spread variants)."""
    if next(model.parameters()).dtype != torch.float64:
        return model
    config = ModelConfig.from_hf_dict(hf_config)
    lifted = 0
    for module in model.modules():
        kind = type(module).__name__
        if kind.endswith("RMSNorm") and norms:
            patched = _gemma_norm_float64 if kind.startswith("Gemma") else _llama_norm_float64
            module.forward = types.MethodType(patched, module)
            lifted += 1
        elif kind.endswith("RotaryEmbedding") and rope:
            vars(module)["float64_inv_freq"] = _float64_frequencies(module, config)  # read by _rotary_float64
            module.forward = types.MethodType(_rotary_float64, module)
            lifted += 1
    if not lifted and (norms or rope):
        raise RuntimeError(f"float64 oracle: no RMSNorm or RotaryEmbedding module found in {type(model).__name__}")
    return model


__all__ = ["lift_float32_casts"]
