"""Devices: the one reading of a user-given device name, and the model's own placement.

Two rules meet here. A device *name* given by a user (``--device``, ``load_model(device=...)``,
a cache's ``device=``) is read by :func:`resolve_device` alone, which refuses a name torch does not
know or a CUDA device this machine lacks, naming what it expects. The *runtime* (``generate``,
``Engine``) never picks a device: it runs where the model's parameters are, in their dtype
(:func:`model_placement`), and refuses a ``device=`` that disagrees instead of moving anything
(:func:`check_model_device`).
"""

from __future__ import annotations

import torch
from torch import nn

from infer_ref.device_names import no_cuda_message
from infer_ref.errors import UsageError

# The device kinds a command line or a model load accepts; caches also take "meta" (sizes only).
USER_DEVICE_KINDS = ("cpu", "cuda")


def default_device() -> torch.device:
    """``cuda`` when a CUDA device is available, else ``cpu`` (never a device this machine lacks)."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def resolve_device(name: str | torch.device | None, *, kinds: tuple[str, ...] = USER_DEVICE_KINDS) -> torch.device:
    """A user-given device as a ``torch.device``, as spelled (``cuda`` stays ``cuda``).

    None means :func:`default_device`. Refused with a :class:`~infer_ref.errors.UsageError`: a name
    torch cannot read, a kind outside ``kinds``, a CUDA device on a machine without CUDA, a CUDA
    index past the machine's devices.
    """
    if name is None:
        return default_device()
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):  # torch's message lists every device type it was built with
        raise UsageError(f"unknown device {name!r}: expected cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(no_cuda_message(str(name)))
    if device.type not in kinds:
        raise UsageError(f"unsupported device {name!r}: expected cpu, cuda or cuda:N")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise UsageError(f"device {name!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device


def resolve(device: str | torch.device | None) -> torch.device:
    """:func:`resolve_device` (``meta`` allowed) with the CUDA index filled in, for allocating tensors.

    A CUDA device without an index gets the current one (``cuda`` -> ``cuda:0``), as the tensors
    allocated on it report: ``torch.device("cuda") != torch.device("cuda:0")``, so comparing a
    tensor's device with an unindexed one would refuse a tensor that is where it should be.
    """
    out = resolve_device(device, kinds=(*USER_DEVICE_KINDS, "meta"))
    if out.type == "cuda" and out.index is None:
        out = torch.device("cuda", torch.cuda.current_device())
    return out


def model_placement(model: nn.Module) -> tuple[torch.device, torch.dtype]:
    """The device and dtype of the model's parameters: where and in what the runtime computes."""
    param = next(model.parameters())
    return param.device, param.dtype


def check_model_device(model: nn.Module, device: str | torch.device | None) -> torch.device:
    """The model's device; a ``device`` that names another one is refused (nothing is moved).

    ``None`` accepts the model's device. ``"cuda"`` matches a model on the current CUDA device.
    """
    model_device, _ = model_placement(model)
    if device is None:
        return model_device
    wanted = resolve(device)
    if wanted != model_device:
        raise UsageError(
            f"device={str(device)!r} but the model's parameters are on {model_device}: the runtime computes where "
            f"the model is; move the model (model.to(...)) or leave device unset"
        )
    return model_device


def device_label(device: str) -> str:
    """``device`` as a report names it: a CUDA device with its GPU's name (``cuda (NVIDIA H100 80GB HBM3)``)."""
    if device.startswith("cuda") and torch.cuda.is_available():
        return f"{device} ({torch.cuda.get_device_name(torch.device(device))})"
    return device
