"""Each layer's sliding window, as a cache keeps it for its snapshots (the model gives each step its windows)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from infer_ref.config import ModelConfig


def check_layer_windows(windows: Sequence[int | None] | None, num_layers: int) -> list[int | None] | None:
    """``windows`` as a list (one positive int or None per layer), or None; anything else is refused."""
    if windows is None:
        return None
    out = list(windows)
    if len(out) != num_layers or any(w is not None and (isinstance(w, bool) or not isinstance(w, int) or w <= 0) for w in out):
        raise ValueError(f"layer_windows must give each of the {num_layers} layers a positive window or None, got {out}")
    return out


def model_layer_windows(config: ModelConfig) -> list[int | None]:
    """Each layer's sliding window (None for global layers), as the models apply them."""
    return [config.sliding_window if t == "sliding_attention" else None for t in config.layer_types]


__all__ = ["check_layer_windows", "model_layer_windows"]
