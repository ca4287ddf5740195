"""Every file of this repository the docs name is there (old: README's `scripts/install_<engine>.sh`
matched no script's name; docs/mutation.md named two modules that had moved), and README names
each engine's install script as the registry knows it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from infer_ref.conformance.engines.registry import RECORDS

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
# where a page's `a/b.py` is read from: the root, or a package the page's table is relative to
BASES = [ROOT, ROOT / "infer_ref", ROOT / "infer_ref" / "conformance", ROOT / "infer_ref" / "conformance" / "engines",
         ROOT / "infer_ref" / "fast", ROOT / "infer_ref" / "fast" / "kernels", ROOT / "docs", ROOT / "tests"]  # fmt: skip
# folders of other projects' sources, cited where a page explains an engine's behaviour
OTHER_PROJECTS = ("vllm/", "conversion/", "specs/", "builders/", "engine-repros/")
PATH = re.compile(r"`([\w.-]+(?:/[\w.-]+)+\.(?:py|sh|md|json|txt|toml|svg))(?:::[^`]*)?`")


def named_paths(page: Path) -> list[tuple[int, str]]:
    """(line, path) of each repository path the page names in backticks, with a folder part."""
    return [(i, m) for i, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
            for m in PATH.findall(line) if not m.startswith(OTHER_PROJECTS)]  # fmt: skip


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_repository_path_a_page_names_is_there(page: Path) -> None:
    missing = [f"{page.name}:{line}: {path}" for line, path in named_paths(page)
               if not any((base / path).exists() for base in [*BASES, page.parent])]  # fmt: skip
    assert missing == []


def test_readme_names_each_engines_install_script_and_each_script_it_names_is_there() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    scripts = {Path(r.install).name for r in RECORDS if r.install}
    assert scripts and all(name in readme for name in scripts), sorted(s for s in scripts if s not in readme)
    named = set(re.findall(r"install_\w+\.sh", readme))
    assert named == scripts and all((ROOT / "scripts" / name).is_file() for name in named), named
