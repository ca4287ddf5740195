"""Old import paths, kept working for one release with a DeprecationWarning.

``infer_ref.testing`` and ``infer_ref.golden`` became one package, ``infer_ref.conformance``; the
kernels and the decode-kernel switch moved into the fast path's package, ``infer_ref.fast``;
``FastDecoder`` and its captured step moved into the runtime (``infer_ref.engine.fast_decoder``,
``infer_ref.engine.capture``, the greedy loop's read-back in ``infer_ref.engine.readback``); the
block manager moved beside the engine's scheduler; sampling and a request's result moved below both
the engine and the fast path (``infer_ref.sampling``, ``infer_ref.results``); the command-line
modules became the package ``infer_ref.cli``.
:data:`MOVED` maps every old module name to the module(s) now holding its contents; a meta-path
finder (installed by ``infer_ref/__init__.py``) answers imports of the old names and warns once per
old name, naming the new path:

* an old module with one new home *is* that module (``infer_ref.testing.adapters`` is
  ``infer_ref.conformance.adapters.reference``: same objects, same state, the same pytest plugin);
* an old package, or a module whose contents were split, is a stand-in module that looks names up
  in its new homes, so ``from infer_ref.testing import adapters`` finds the old submodule and not
  the new package that happens to share its name.

``python -m`` on an old name runs the new module's code (the finder hands runpy that code).

A name that left a package which is still there (``from infer_ref.fast import FastDecoder``) is in
:data:`MOVED_NAMES`; the package's ``__getattr__`` hands it to :func:`moved_name`, which warns once
and returns the object from its new home.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings
from collections.abc import Sequence
from typing import Any

_KIT = "infer_ref.conformance"
_GOLDEN = "infer_ref.conformance.oracles.golden"
_CAPTURE = ("infer_ref.engine.fast_decoder", "infer_ref.engine.capture", "infer_ref.engine.readback")

MOVED: dict[str, tuple[str, ...]] = {
    "infer_ref.testing": (_KIT,),
    "infer_ref.testing.adapter": (f"{_KIT}.interface.adapter",),
    "infer_ref.testing.contract": (f"{_KIT}.interface.contract",),
    "infer_ref.testing.probes": (f"{_KIT}.probes",),
    "infer_ref.testing.adapters": (f"{_KIT}.adapters.reference",),
    "infer_ref.testing.adapters_transformers": (f"{_KIT}.adapters.transformers",),
    "infer_ref.testing.oracle": (f"{_KIT}.oracles.definitions", f"{_KIT}.oracles.transformers_fp64"),
    "infer_ref.testing.gemv_oracle": (f"{_KIT}.oracles.gemv",),
    "infer_ref.testing.paged": (f"{_KIT}.oracles.paged",),
    "infer_ref.testing.allocator": (f"{_KIT}.oracles.allocator",),
    "infer_ref.testing.teacher_forced": (f"{_KIT}.oracles.teacher_forced",),
    "infer_ref.testing.synthetic": (f"{_KIT}.checkpoints.snapshots",),
    "infer_ref.testing.checkpoints": (f"{_KIT}.case_models",),
    "infer_ref.testing.strategies": (f"{_KIT}.strategies",),
    "infer_ref.testing.assertions": (f"{_KIT}.assertions",),
    "infer_ref.testing.report": (f"{_KIT}.report",),
    "infer_ref.testing.plugin": (f"{_KIT}.plugin",),
    "infer_ref.testing.profiles": (f"{_KIT}.profiles",),
    "infer_ref.testing.mutants": (f"{_KIT}.mutants",),
    "infer_ref.testing.mutants.__main__": (f"{_KIT}.mutants.__main__",),
    "infer_ref.testing.mutants.caches": (f"{_KIT}.mutants.caches",),
    "infer_ref.testing.mutants.prefix": (f"{_KIT}.mutants.prefix",),
    "infer_ref.testing.conformance": (f"{_KIT}.tests",),
    "infer_ref.golden": (_GOLDEN,),
    "infer_ref.golden.errors": (f"{_GOLDEN}.errors", f"{_GOLDEN}.results"),
    "infer_ref.golden.report": (f"{_GOLDEN}.results",),
    "infer_ref.golden.bugs": (f"{_GOLDEN}.planted",),
    "infer_ref.golden.synthetic": (f"{_KIT}.checkpoints.golden_models",),
    "infer_ref.golden.verification": (f"{_GOLDEN}.verification", f"{_GOLDEN}.implementations"),
    **{
        f"infer_ref.golden.{name}": (f"{_GOLDEN}.{name}",)
        for name in ("format", "sessions", "sources", "tolerances", "writing")
    },
    "infer_ref.kernels": ("infer_ref.fast.kernels",),
    "infer_ref.kernels.store": ("infer_ref.fast.kernels.store",),
    "infer_ref.kernels.gemv": ("infer_ref.fast.kernels.gemv",),
    "infer_ref.kernels.norm": ("infer_ref.norm",),
    "infer_ref.kernels.rotary": ("infer_ref.rotary",),
    "infer_ref.kernels.switch": ("infer_ref.fast.switch",),
    "infer_ref.kernels.decode_step": ("infer_ref.fast.decode_step",),
    "infer_ref.engine.fast_decode": _CAPTURE,
    "infer_ref.fast.decoder": _CAPTURE,
    "infer_ref.engine.sampling": ("infer_ref.sampling",),
    "infer_ref.engine.result": ("infer_ref.results",),
    "infer_ref.cache.prefix": ("infer_ref.engine.block_manager",),
    "infer_ref.golden_cli": ("infer_ref.cli.golden",),
    "infer_ref.conformance_cli": ("infer_ref.cli.conformance",),
    "infer_ref.cli_engine": ("infer_ref.cli.generate_engine",),
}
"""Old module name -> the new module(s) holding its public names, looked up in this order."""

MOVED_NAMES: dict[str, dict[str, str]] = {
    "infer_ref.fast": {"FastDecoder": "infer_ref.engine.fast_decoder", "sliced_argmax": "infer_ref.engine.capture"},
}
"""Package -> {name that left it: the module now holding that name}."""

_OLD_PACKAGES = {
    "infer_ref.testing", "infer_ref.testing.mutants", "infer_ref.testing.conformance", "infer_ref.golden", "infer_ref.kernels",
}
_warned: set[str] = set()


def _message(old: str) -> str:
    return f"{old} has moved to {' and '.join(MOVED[old])}; the old name works for one release"


def _warn_once(old: str) -> None:
    """Warn at the importing line: this frame, the finder or stand-in that called it, then the
    importer (the import system's own frames are skipped)."""
    if old not in _warned:
        _warned.add(old)
        warnings.warn(_message(old), DeprecationWarning, stacklevel=3)


def moved_name(package: str, name: str) -> Any:
    """``package.name`` from its new home (:data:`MOVED_NAMES`), warning once at the line that asked
    for it (this frame, the package's ``__getattr__``, then the importer)."""
    home = MOVED_NAMES[package][name]
    old = f"{package}.{name}"
    if old not in _warned:
        _warned.add(old)
        warnings.warn(f"{old} has moved to {home}.{name}; the old name works for one release", DeprecationWarning, stacklevel=3)
    return getattr(importlib.import_module(home), name)


class _StandIn(types.ModuleType):
    """An old package (or a split module): names are looked up in the new homes, in order."""

    def __init__(self, old: str, homes: Sequence[str], is_package: bool) -> None:
        super().__init__(old, f"Moved to {' and '.join(homes)}.")
        self.__homes = tuple(homes)
        if is_package:
            self.__path__: list[str] = []  # old submodules are found through the finder

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        child = f"{self.__name__}.{name}"
        if child in MOVED:  # `from OLD import child`
            _warn_once(child)
            return importlib.import_module(child)
        for home in self.__homes:
            module = importlib.import_module(home)
            if hasattr(module, name):
                return getattr(module, name)
        raise AttributeError(f"module {self.__name__!r} (moved to {' and '.join(self.__homes)}) has no attribute {name!r}")

    def __dir__(self) -> list[str]:
        names = set(super().__dir__())
        for home in self.__homes:
            names |= set(dir(importlib.import_module(home)))
        return sorted(names)


class _MovedLoader(importlib.abc.Loader):
    def __init__(self, old: str) -> None:
        self.old = old
        self.homes = MOVED[old]

    def _is_alias(self) -> bool:
        return len(self.homes) == 1 and self.old not in _OLD_PACKAGES

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        if self._is_alias():
            module = importlib.import_module(self.homes[0])
            self._own_spec = module.__spec__  # the import system overwrites it; put back in exec_module
            return module
        return _StandIn(self.old, self.homes, self.old in _OLD_PACKAGES)

    def exec_module(self, module: types.ModuleType) -> None:
        if self._is_alias():
            module.__spec__ = self._own_spec

    def get_code(self, fullname: str) -> types.CodeType | None:
        """For ``python -m OLD``: runpy runs the new module's code as ``__main__``."""
        package = self.old.removesuffix(".__main__")  # attributed to __main__, which Python shows by default
        warnings.warn_explicit(_message(package), DeprecationWarning, f"<python -m {package}>", 0, module="__main__")
        spec = importlib.util.find_spec(self.homes[0])
        assert spec is not None and isinstance(spec.loader, importlib.abc.InspectLoader)
        return spec.loader.get_code(self.homes[0])

    def is_package(self, fullname: str) -> bool:
        return self.old in _OLD_PACKAGES


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        _warn_once(fullname)
        spec = importlib.machinery.ModuleSpec(fullname, _MovedLoader(fullname), is_package=fullname in _OLD_PACKAGES)
        if fullname in _OLD_PACKAGES:  # where the files are now (for ``pytest --pyargs OLD``)
            home = importlib.util.find_spec(MOVED[fullname][0])
            assert home is not None
            spec.origin, spec.submodule_search_locations = home.origin, list(home.submodule_search_locations or [])
        return spec


def install() -> None:
    """Answer imports of the old names (once per process)."""
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _MovedFinder())
