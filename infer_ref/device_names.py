"""Device names read without importing torch: what a command line refuses before torch loads.

Importing torch takes seconds (2.4 s on a loaded 2-core machine), so a command that refuses
``--device mps`` or ``--device cuda`` on a machine without CUDA answers from here first:

* the name's spelling (``cpu``, ``cuda``, ``cuda:N``), by a pattern;
* whether the torch that is installed was built with a GPU backend at all, read from its
  ``torch/version.py`` (the build records ``cuda`` and ``hip`` there) without importing torch. A
  build without one can have no CUDA device; a build with one needs torch's own runtime check
  (drivers, visible cards), which :func:`infer_ref.devices.resolve_device` makes.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from functools import cache
from pathlib import Path

from infer_ref.errors import UsageError

__all__ = ["check_device_name", "no_cuda_message", "torch_gpu_build"]

# The device names a user may give: torch's spelling of the two kinds infer_ref runs on.
DEVICE_NAME = re.compile(r"(cpu|cuda)(:[0-9]+)?")


def check_device_name(name: str) -> str:
    """``name``'s device kind (``cpu`` or ``cuda``); anything else is a :class:`UsageError`."""
    match = DEVICE_NAME.fullmatch(name)
    if match is None:
        raise UsageError(f"unsupported device {name!r}: expected cpu, cuda or cuda:N")
    return match.group(1)


def no_cuda_message(name: str) -> str:
    """The refusal of a CUDA device on a machine without one (the same words with or without torch)."""
    return f"device {name!r} requested but CUDA is not available on this machine; use --device cpu"


@cache
def torch_gpu_build() -> bool | None:
    """Whether the installed torch was built with CUDA or ROCm (``torch.version.cuda``/``hip``),
    read from its ``version.py`` without importing torch; None when that file cannot be read."""
    try:
        spec = importlib.util.find_spec("torch")  # finds the package; imports nothing of it
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None:
        return None
    try:
        tree = ast.parse((Path(spec.origin).parent / "version.py").read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    recorded: dict[str, object] = {}
    for node in tree.body:  # `cuda: Optional[str] = None` or `cuda = '12.8'`
        target: ast.expr
        if isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        else:
            continue
        if isinstance(target, ast.Name) and target.id in ("cuda", "hip") and isinstance(value, ast.Constant):
            recorded[target.id] = value.value
    if set(recorded) != {"cuda", "hip"}:
        return None  # a layout this reading does not know: let torch answer
    return any(value is not None for value in recorded.values())
