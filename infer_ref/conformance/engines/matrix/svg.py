"""The matrix as an SVG picture, written by hand: the same grid as the table, one coloured cell
per (property, engine, family) with the table's marks, engine and version headers, a legend."""

from __future__ import annotations

from xml.sax.saxutils import escape, quoteattr

from infer_ref.conformance.engines.matrix.grid import MARKS, MEANINGS, NOT_RUN, Grid

COLOURS = {
    "passed": "#b7e1b0",
    "xfailed": "#f6d58e",
    "failed": "#f08c8c",
    "not judged": "#b9c7e8",
    "skipped": "#dcdcdc",
    "not run": "#ffffff",
}
CELL_W, CELL_H = 60, 20
MONO_W = 6.1  # a rough width of one 10 px monospace character: the property names' column fits the longest
HEADER_H = 78  # engine, version (two lines), family rows
GAP = 8  # between engines' column blocks
CHAR_W = 6.2  # a rough width of one 11 px character, to fit the version under its block


def matrix_svg(grid: Grid) -> str:
    n_fam = len(grid.families)
    block_w = n_fam * CELL_W
    rows = sum(1 + len(tests) for _, tests in grid.groups)
    label_w = int(12 + MONO_W * max((len(t) for _, tests in grid.groups for t in tests), default=20) + 12)
    width = label_w + len(grid.engines) * (block_w + GAP)
    legend_y = HEADER_H + rows * CELL_H + 16
    height = legend_y + (len(MEANINGS) + 1) * 16 + 8
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
    ]
    for index, result in enumerate(grid.engines):
        x = label_w + index * (block_w + GAP)
        out.append(_text(x + block_w / 2, 16, result.engine, anchor="middle", weight="bold"))
        for line, text in enumerate(_wrap(result.version, block_w)):
            out.append(_text(x + block_w / 2, 30 + 13 * line, text, anchor="middle", title=result.version))
        for f, family in enumerate(grid.families):
            out.append(_text(x + (f + 0.5) * CELL_W, 70, family, anchor="middle"))
    y = HEADER_H
    for title, tests in grid.groups:
        out.append(_text(4, y + 14, title, weight="bold"))
        y += CELL_H
        for test in tests:
            out.append(_text(12, y + 14, test, family="monospace", size=10))
            for index, result in enumerate(grid.engines):
                x = label_w + index * (block_w + GAP)
                for f, family in enumerate(grid.families):
                    cell = grid.cell(test, index, family)
                    out.append(
                        f'<rect class="cell" data-property={quoteattr(test)} '
                        f"data-engine={quoteattr(result.engine)} "
                        f'data-family={quoteattr(family)} x="{x + f * CELL_W}" y="{y}" width="{CELL_W - 1}" '
                        f'height="{CELL_H - 1}" fill="{COLOURS[cell.worst]}" stroke="#999" '
                        'stroke-width="0.5"/>'
                    )
                    out.append(_text(x + (f + 0.5) * CELL_W, y + 14, cell.text, anchor="middle"))
            y += CELL_H
    out += _legend(legend_y)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _legend(y: int) -> list[str]:
    out = [_text(4, y, "Legend (a count follows each mark where a family's cases differ):", weight="bold")]
    fills = {MARKS[o]: COLOURS[o] for o in MARKS} | {NOT_RUN: COLOURS["not run"]}
    for row, (mark, meaning) in enumerate(MEANINGS.items(), start=1):
        top = y + row * 16 - 11
        out.append(
            f'<rect x="4" y="{top}" width="24" height="14" fill="{fills[mark]}" stroke="#999" '
            'stroke-width="0.5"/>'
        )
        out.append(_text(16, top + 11, mark, anchor="middle"))
        out.append(_text(36, top + 11, meaning))
    return out


def _wrap(text: str, width: float) -> list[str]:
    """``text`` in at most two lines of ``width`` (the second cut with an ellipsis if still too long)."""
    most = max(4, int(width / CHAR_W))
    first = ""
    for word in text.split(" "):
        if first and len(first) + 1 + len(word) > most:
            break
        first = f"{first} {word}".strip()
    first = first or text[:most]
    rest = text[len(first) :].strip()
    if not rest:
        return [first]
    return [first, rest if len(rest) <= most else rest[: most - 1] + "…"]


def _text(
    x: float,
    y: float,
    text: str,
    *,
    anchor: str = "start",
    weight: str = "normal",
    family: str | None = None,
    size: int | None = None,
    title: str | None = None,
) -> str:
    attrs = f'x="{x:g}" y="{y:g}" text-anchor="{anchor}"' + (
        f' font-weight="{weight}"' if weight != "normal" else ""
    )
    attrs += f' font-family="{family}"' if family else ""
    attrs += f' font-size="{size}"' if size else ""
    inner = escape(text) + (f"<title>{escape(title)}</title>" if title and title != text else "")
    return f"<text {attrs}>{inner}</text>"
