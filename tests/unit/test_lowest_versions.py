"""scripts/lowest_versions.py: the floors pyproject.toml declares become the pins of .ci/run's
lowest-versions stage; a requirement with no single floor is refused, naming it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest


@pytest.fixture(scope="module")
def script(load_script: Callable[[str], ModuleType]) -> ModuleType:
    return load_script("lowest_versions")


def write(folder: Path, dependencies: list[str], test: list[str]) -> Path:
    path = folder / "pyproject.toml"
    quoted = lambda items: ", ".join(f"'{i}'" for i in items)  # noqa: E731  (TOML literal strings)
    path.write_text(f"[project]\ndependencies = [{quoted(dependencies)}]\n"
                    f"[project.optional-dependencies]\ntest = [{quoted(test)}]\n")  # fmt: skip
    return path


def test_every_dependency_and_test_extra_is_pinned_at_its_floor(script: ModuleType, tmp_path: Path) -> None:
    path = write(tmp_path, ["torch>=2.6", "numpy >= 1.24"], ["pytest>=8", 'transformers>=4.56; python_version >= "3.10"'])
    assert script.floors(path) == {"torch": "2.6", "numpy": "1.24", "pytest": "8", "transformers": "4.56"}


@pytest.mark.parametrize("requirement", ["torch", "torch>=2.6,<3", "torch==2.6", "torch~=2.6"])
def test_a_requirement_without_one_floor_is_refused(script: ModuleType, tmp_path: Path, requirement: str) -> None:
    with pytest.raises(SystemExit, match=f"'{requirement}' has no single '>=' floor"):
        script.floors(write(tmp_path, [requirement], []))


def test_the_projects_floors_cover_what_ci_installs(script: ModuleType) -> None:
    names = set(script.floors())
    assert {"torch", "transformers", "safetensors", "hypothesis", "pytest", "pytest-xdist", "pytest-benchmark", "numpy"} <= names
    assert set(script.UNPINNED) <= names
