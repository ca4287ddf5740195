"""The command line of the matrix (``scripts/engine_matrix.py``, ``python -m
infer_ref.conformance.engines.matrix``).

    engine_matrix.py --engines infer_ref transformers vllm llama.cpp ... --out DIR   run each tier, then draw
    engine_matrix.py --results DIR [--version E=TEXT] [--xfails E=FILE]             draw from DIR/E.xml (+
    E.json)
    engine_matrix.py REPORT.xml TITLE                                               one engine's property x
    checkpoint table

Drawing writes ``--md`` (default docs/engines-matrix.md) and ``--svg`` (default docs/engines-matrix.svg).
With ``--engines``, the exit status is 1 when a tier that ran failed (after drawing); an engine
left out for want of its venv does not fail it.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from infer_ref.conformance.engines.matrix.grid import build_grid
from infer_ref.conformance.engines.matrix.markdown import checkpoint_table, matrix_markdown
from infer_ref.conformance.engines.matrix.results import EngineResult, load_result, read_junit
from infer_ref.conformance.engines.matrix.svg import matrix_svg
from infer_ref.conformance.engines.matrix.tier_runs import LONG_CONTEXT_DIR, RUNS, check_engines, run_engines
from infer_ref.errors import UsageError


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="engine_matrix.py", description=__doc__.split("\n\n")[0] if __doc__ else None
    )
    p.add_argument(
        "--engines", nargs="+", metavar="ENGINE", help=f"run the tier on these ({', '.join(RUNS)}), then draw"
    )
    p.add_argument(
        "--out", type=Path, metavar="DIR", help="with --engines: where each engine's XML, JSON and log go"
    )
    p.add_argument(
        "--model-dir",
        action="append",
        type=Path,
        default=[],
        metavar="DIR",
        help="with --engines: judge on these checkpoints only (default: the kit's)",
    )
    p.add_argument(
        "--long-context",
        action="store_true",
        help="with --engines: run the long-context workload instead, into OUT/long "
        "(drawn beside the default one)",
    )
    p.add_argument(
        "--results", type=Path, metavar="DIR", help="draw from DIR/ENGINE.xml (and ENGINE.json where there)"
    )
    p.add_argument(
        "--version",
        action="append",
        default=[],
        metavar="ENGINE=TEXT",
        help="the engine's version, where its results carry none (no report JSON)",
    )
    p.add_argument(
        "--xfails",
        action="append",
        default=[],
        metavar="ENGINE=FILE",
        help="count the failures listed in FILE as expected: results of a run made without it",
    )
    p.add_argument(
        "--md", type=Path, default=Path("docs/engines-matrix.md"), help="the table (default %(default)s)"
    )
    p.add_argument(
        "--svg", type=Path, default=Path("docs/engines-matrix.svg"), help="the picture (default %(default)s)"
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if len(argv) == 2 and not argv[0].startswith("-"):
            print(checkpoint_table(read_junit(Path(argv[0])), argv[1]), end="")
            return 0
        return draw(parser().parse_args(argv), argv)
    except UsageError as e:
        print(f"engine_matrix.py: {e}", file=sys.stderr)
        return 2


def draw(args: argparse.Namespace, argv: Sequence[str]) -> int:
    if bool(args.engines) == bool(args.results):
        raise UsageError(
            "give --engines E ... --out DIR (run, then draw) or --results DIR (draw), one of them"
        )
    if args.engines:
        if args.out is None:
            raise UsageError("--engines needs --out DIR: where each engine's results go")
        check_engines(args.engines)
        statuses = run_engines(args.engines, args.out, args.model_dir, long_context=args.long_context)
        folder, engines = args.out, list(statuses)
    else:
        folder, engines, statuses = args.results, engines_in(args.results), {}
    results = [
        result_of(e, folder, _pairs(args.version, "--version"), _pairs(args.xfails, "--xfails"))
        for e in engines
    ]
    if not results:
        raise UsageError(f"{folder}: no engine results to draw (expected ENGINE.xml files)")
    grid = build_grid(results)
    command = "python scripts/engine_matrix.py " + shlex.join(argv)
    args.md.parent.mkdir(parents=True, exist_ok=True)
    args.svg.parent.mkdir(parents=True, exist_ok=True)
    args.md.write_text(
        matrix_markdown(grid, command, Path(os.path.relpath(args.svg, args.md.parent)).as_posix())
    )
    args.svg.write_text(matrix_svg(grid))
    print(
        f"wrote {args.md} and {args.svg}: {len(results)} engines, {sum(len(t) for _, t in grid.groups)} "
        "properties, "
        f"families {', '.join(grid.families)}"
    )
    return 1 if any(statuses.values()) else 0  # drawn either way; a tier that failed fails the command (CI)


def engines_in(folder: Path) -> list[str]:
    """The engines with results in ``folder``: the tier's registry order first, then by name."""
    if not folder.is_dir():
        raise UsageError(f"--results {folder}: no such folder")
    found = {p.stem for p in folder.glob("*.xml")}
    return [e for e in RUNS if e in found] + sorted(found - set(RUNS))


def result_of(engine: str, folder: Path, versions: dict[str, str], xfails: dict[str, str]) -> EngineResult:
    """The engine's results in ``folder``, its long-context ones (``folder/long``) added where there."""
    report = folder / f"{engine}.json"
    result = load_result(
        engine,
        folder / f"{engine}.xml",
        report if report.is_file() else None,
        versions.get(engine),
        Path(xfails[engine]) if engine in xfails else None,
    )
    long_folder = folder / LONG_CONTEXT_DIR
    if (long_folder / f"{engine}.xml").is_file():
        long_report = long_folder / f"{engine}.json"
        long = load_result(
            engine,
            long_folder / f"{engine}.xml",
            long_report if long_report.is_file() else None,
            versions.get(engine),
            Path(xfails[engine]) if engine in xfails else None,
        )
        result.cases += long.cases
        result.tolerances += [f"long contexts: {t}" for t in long.tolerances]
        result.run += f"; long contexts {long.run}" if long.run else ""
    return result


def _pairs(values: Sequence[str], option: str) -> dict[str, str]:
    out = {}
    for value in values:
        engine, sep, text = value.partition("=")
        if not sep or not engine or not text:
            raise UsageError(f"{option} {value!r}: expected ENGINE=VALUE")
        out[engine] = text
    return out
