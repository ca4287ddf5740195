"""What the ``infer-ref`` commands share: dtypes, devices, model names, output paths, errors.

Every command module imports from here and from the library below it, never from another
command. A user error is an :class:`~infer_ref.errors.InferRefError`; :func:`run_command` turns it
into one line on stderr and its documented exit status (``docs/errors.md``), while a bug keeps its
traceback.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infer_ref.errors import EXIT_USAGE, UsageError, run_reporting_user_errors
from infer_ref.paths import FIXTURE_CHECKPOINTS

if TYPE_CHECKING:  # torch is imported when a command runs, never to parse or refuse its arguments
    import torch

__all__ = [
    "DEFAULT_MODEL", "DTYPES", "EXIT_USAGE", "FIXTURES", "UsageError", "check_output_paths", "default_dtype",
    "resolve_device", "resolve_model", "run_command", "run_labels",
]

FIXTURES = FIXTURE_CHECKPOINTS
DEFAULT_MODEL = "llama-tiny"
# Model / attention dtypes by their command-line names, which are torch's (the order ``conformance --help`` lists them in).
DTYPES = ("float64", "float32", "bfloat16", "float16")


def run_command(call: Callable[[], int], prog: str) -> int:
    """Run one command; a user error becomes one line and its exit status (``infer_ref.errors``)."""
    return run_reporting_user_errors(call, prog)


def default_dtype(name: str | None, device: torch.device) -> torch.dtype:
    """``--dtype``, or bfloat16 on CUDA and float32 on the CPU when it is not given."""
    import torch

    if name is not None:
        if name not in DTYPES:
            raise UsageError(f"unknown dtype {name!r}: expected one of {', '.join(DTYPES)}")
        dtype: torch.dtype = getattr(torch, name)
        return dtype
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def resolve_device(name: str | None) -> torch.device:
    """``--device`` checked and resolved (:func:`infer_ref.devices.resolve_device`; imports torch)."""
    from infer_ref.devices import resolve_device as resolve

    return resolve(name)


def resolve_model(name: str) -> Path:
    """A fixture name, a snapshot folder, or a name under $INFER_REF_MODELS."""
    from infer_ref.paths import check_not_ambiguous, resolve_model_path

    fixture = FIXTURES / name
    try:
        found = resolve_model_path(name)
    except FileNotFoundError as err:
        if "/" not in name and fixture.is_dir():
            return fixture
        fixtures = ", ".join(sorted(p.name for p in FIXTURES.iterdir())) if FIXTURES.is_dir() else "none found"
        raise UsageError(f"{err} Embedded fixtures: {fixtures}.") from None
    if "/" not in name and fixture.is_dir():
        check_not_ambiguous(name, fixture, found)
    return found


def run_labels(folder: Path, config: Any, device: torch.device, dtype: torch.dtype) -> dict[str, str]:
    """The first fields of a ``generate`` summary: which model ran where, in what dtype."""
    return {
        "model": str(folder),
        "model_type": config.model_type,
        "device": str(device),
        "dtype": str(dtype).removeprefix("torch."),
    }


def check_output_paths(*paths: str | Path | None) -> None:
    """Output paths that can never be written (a folder, a path in a missing folder) are refused before any work."""
    from infer_ref.fileio import check_output_path

    for path in paths:
        if path is not None:
            check_output_path(path)
