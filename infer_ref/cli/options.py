"""What the ``infer-ref`` commands share: dtypes, devices, model names, output paths, errors.

Every command module imports from here and from the library below it, never from another
command. A user error is an :class:`~infer_ref.errors.InferRefError`; :func:`run_command` turns it
into one line on stderr and its documented exit status (``docs/errors.md``), while a bug keeps its
traceback.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from infer_ref.device_names import check_device_name, no_cuda_message, torch_gpu_build
from infer_ref.errors import EXIT_USAGE, UsageError, run_reporting_user_errors
from infer_ref.paths import FIXTURE_CHECKPOINTS

if TYPE_CHECKING:  # torch is imported when a command runs, never to parse or refuse its arguments
    import torch

__all__ = [
    "DEFAULT_MODEL", "DTYPES", "EXIT_USAGE", "FIXTURES", "OneLineParser", "UsageError", "check_device", "check_output_paths",
    "check_user_adapter",
    "default_dtype", "module_found", "resolve_device", "resolve_model", "run_command", "run_labels", "user_object",
]

FIXTURES = FIXTURE_CHECKPOINTS
DEFAULT_MODEL = "llama-tiny"
# Model / attention dtypes by their command-line names, which are torch's (the order ``conformance --help`` lists them in).
DTYPES = ("float64", "float32", "bfloat16", "float16")


class OneLineParser(argparse.ArgumentParser):
    """argparse, whose refusals are :class:`UsageError`: the one line every other usage error is
    (``infer-ref: error: ...``, exit 2, :func:`run_command`), naming where the options are listed,
    instead of argparse's usage block over a line in a form of its own. Its subparsers are of this
    class too (argparse makes them of the parent's)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (`{self.prog} --help` lists the options)")


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


def check_device(name: str | None) -> None:
    """``--device`` refused before torch is imported wherever that can be decided without it: a name
    that is not cpu, cuda or cuda:N, and CUDA with a torch built without a GPU backend
    (:mod:`infer_ref.device_names`). With a GPU build, torch itself says whether a card is there."""
    if name is None or check_device_name(name) == "cpu":
        return
    if torch_gpu_build() is False:
        raise UsageError(no_cuda_message(name))
    resolve_device(name)  # drivers, visible cards, the index: torch's runtime check


def user_object(spec: str, option: str, expected: str, kind: str = "OBJECT", default_attr: str | None = None) -> object:
    """``module:OBJECT`` of ``option`` imported and looked up before pytest or torch is started for it.

    The module is looked for on the path and in the working directory (as ``python -m`` and
    ``pytest`` find a user's modules); what is wrong is one line naming the option the user typed.
    ``kind`` is how the messages spell OBJECT (``FACTORY``), ``expected`` what it should be;
    ``default_attr`` is OBJECT when ``spec`` names a module alone. Importing the user's module is the check: it may import torch itself.
    """
    module_name, _, attr = spec.partition(":")
    attr = attr or default_attr or ""
    shape = f"module:{kind}, {kind} being {expected}"
    if not module_name or not attr:
        raise UsageError(f"{option} {spec!r}: expected {shape}")
    working_directory_on_path()
    if not module_found(module_name):
        raise UsageError(f"{option} {spec!r}: no module {module_name!r} on the path or in the working directory "
                         f"{os.getcwd()} (expected {shape})")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:  # the module is there; something it imports is not
        raise UsageError(f"{option} {spec!r}: importing {module_name} failed: {exc}") from None
    if not hasattr(module, attr):
        raise UsageError(f"{option} {spec!r}: module {module_name!r} has no {attr!r} (expected {shape})")
    return getattr(module, attr)


def check_user_adapter(spec: str, option: str, expected: str) -> None:
    """``--impl module:OBJECT`` names an Adapter, or a callable that may return one (called by the
    suite, not here): refused in one line naming ``option`` otherwise."""
    found = user_object(spec, option, expected, default_attr="ADAPTER")
    from infer_ref.conformance.interface.adapter import Adapter  # torch: the user's module has imported it

    if not isinstance(found, Adapter) and not callable(found):
        raise UsageError(f"{option} {spec!r} is a {type(found).__name__}, expected {expected}")


def module_found(name: str) -> bool:
    """Whether ``name`` can be imported, without importing it (its parent packages are)."""
    try:
        return bool(name) and importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent package missing, or a relative name
        return False


def working_directory_on_path() -> None:
    """Put the working directory first on ``sys.path``, where ``python -m`` puts it: a module the
    user names (``--impl my_adapter:ADAPTER``, ``--engine my_engine:start``) is found from where they
    run the command, in a checkout or not, with no ``PYTHONPATH``. pytest-xdist's workers copy this path."""
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)


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
