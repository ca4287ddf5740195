"""The default device of the library: CUDA when this machine has it, else the CPU."""

from __future__ import annotations

import torch


def default_device() -> torch.device:
    """``cuda`` when a CUDA device is available, else ``cpu`` (never a device this machine lacks)."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def resolve(device: str | torch.device | None) -> torch.device:
    """``device`` as a ``torch.device``; None means :func:`default_device`."""
    return default_device() if device is None else torch.device(device)
