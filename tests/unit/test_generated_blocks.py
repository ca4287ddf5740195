"""``replace_between_markers``: a page's generated block rewritten, the rest untouched; a page
without the markers refused with nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest

from infer_ref.errors import UsageError
from infer_ref.fileio import replace_between_markers


def test_only_the_block_between_the_markers_changes(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("head\n<!-- power:start -->\nold\n<!-- power:end -->\ntail\n")
    replace_between_markers(page, "power", "new | table")
    assert page.read_text() == "head\n<!-- power:start -->\nnew | table\n<!-- power:end -->\ntail\n"


@pytest.mark.parametrize("text", ["no markers\n", "<!-- power:start -->\nonly the start\n", "<!-- calibration:start -->\n<!-- calibration:end -->\n"])
def test_a_page_without_the_block_is_refused_and_left_as_it_was(tmp_path: Path, text: str) -> None:
    page = tmp_path / "page.md"
    page.write_text(text)
    with pytest.raises(UsageError, match=r"no <!-- power:start --> \.\.\. <!-- power:end --> block"):
        replace_between_markers(page, "power", "new")
    assert page.read_text() == text
