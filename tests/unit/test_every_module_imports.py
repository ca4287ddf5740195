"""Every module of the package imports: a module moved or renamed without its importers fails here.

mypy (``ignore_missing_imports``) and the import contracts do not report an ``import`` of an
``infer_ref`` module that no longer exists; a module imported only by a test that is not run, or by
an engine's worker in its own venv, would otherwise break unseen. A module that needs an optional
package this environment lacks (Triton, an engine's own package in its worker) is left out, by the
name of what is missing: a missing ``infer_ref`` module is never such a reason.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path

import infer_ref


def _module_names(package_path: list[str], prefix: str) -> list[str]:
    # ``__main__`` modules run their command when imported, and the kit's test modules are imported by
    # pytest's collection under the kit's options: both are tested where they run.
    walk = pkgutil.walk_packages(package_path, prefix=prefix)
    return sorted(
        info.name for info in walk if not info.name.endswith(".__main__") and ".tests" not in info.name
    )


def _broken_imports(names: list[str], own: str) -> list[str]:
    """The modules of ``names`` whose import fails for want of a module or name of package ``own``."""
    broken: list[str] = []
    for name in names:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as error:
            missing = error.name or ""
            if missing == own or missing.startswith(f"{own}."):
                broken.append(f"{name}: {error}")
        except ImportError as error:  # a name no longer defined where it is imported from
            if own in str(error):
                broken.append(f"{name}: {error}")
    return broken


def test_every_infer_ref_module_imports_or_lacks_only_an_optional_outside_package() -> None:
    names = _module_names(list(infer_ref.__path__), "infer_ref.")
    assert len(names) > 100, names  # the walk found the package, not an empty path
    broken = _broken_imports(names, "infer_ref")
    assert not broken, "modules that import what the package no longer has:\n" + "\n".join(broken)


def test_a_moved_module_is_reported_and_a_missing_outside_package_is_not(tmp_path: Path) -> None:
    package = tmp_path / "moved_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "fine.py").write_text("X = 1\n")
    (package / "stale_path.py").write_text("import moved_pkg.gone\n")
    (package / "stale_name.py").write_text("from moved_pkg.fine import Y\n")
    (package / "optional.py").write_text("import a_package_this_environment_lacks\n")
    sys.path.insert(0, str(tmp_path))
    try:
        names = _module_names([str(package)], "moved_pkg.")
        broken = _broken_imports(names, "moved_pkg")
    finally:
        sys.path.remove(str(tmp_path))
        for name in [n for n in sys.modules if n == "moved_pkg" or n.startswith("moved_pkg.")]:
            del sys.modules[name]
    assert names == ["moved_pkg.fine", "moved_pkg.optional", "moved_pkg.stale_name", "moved_pkg.stale_path"]
    assert [line.split(":")[0] for line in broken] == ["moved_pkg.stale_name", "moved_pkg.stale_path"], broken
