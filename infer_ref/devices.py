"""The default device of the library: CUDA when this machine has it, else the CPU."""

from __future__ import annotations

import torch

from infer_ref.errors import UsageError


def default_device() -> torch.device:
    """``cuda`` when a CUDA device is available, else ``cpu`` (never a device this machine lacks)."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def resolve(device: str | torch.device | None) -> torch.device:
    """``device`` as a ``torch.device``; None means :func:`default_device`.

    A CUDA device without an index gets the current one (``cuda`` -> ``cuda:0``), as the tensors
    allocated on it report: ``torch.device("cuda") != torch.device("cuda:0")``, so comparing a
    tensor's device with an unindexed one would refuse a tensor that is where it should be.
    """
    try:
        out = default_device() if device is None else torch.device(device)
    except (RuntimeError, TypeError):  # torch's message lists every device type it was built with
        raise UsageError(f"unknown device {device!r}: expected cpu, cuda or cuda:N (or a torch.device)") from None
    if out.type == "cuda" and not torch.cuda.is_available():  # torch would raise an AssertionError at first use
        raise UsageError(f"device {device!r} requested but CUDA is not available on this machine; use 'cpu'")
    if out.type == "cuda" and out.index is None and torch.cuda.is_available():
        out = torch.device("cuda", torch.cuda.current_device())
    return out
