"""The docs' figures, generated from committed results (docs/engine-results, benchmarks/log) and the code.

    python scripts/doc_figures.py            # print every block
    python scripts/doc_figures.py --write    # rewrite them in the docs
    python scripts/doc_figures.py --check    # exit 1 naming each block that is stale

``oracle-distances`` (docs/conformance.md): the largest distance from the float64 oracle each
float32 engine's recorded run saw, against the tolerance it was judged at (the report's notes).
``engine-run-times`` (docs/engines.md): how long each recorded run took and when (its JUnit file),
the default and the long-context workload; ``long-context-counts`` (docs/engines.md): each engine's
counts on the long-context workload; ``recorded-run(s)-...`` (docs/engines.md's investigations): one
engine's recorded run in a line, its counts, requests left out and time; ``consistency-tolerances``
(docs/conformance.md): each engine's measured spread between two schedules and its tolerance (the
registry); ``float64-spread`` (docs/conformance.md): the float64 tables (each computation's and
planted bug's distance from the float64 definition, the tiers' margins) from the record of ``python -m
infer_ref.conformance.precision_spread --examples 24 --mutants --json benchmarks/log/precision_spread.json``;
``mutation-scores`` and ``mutation-equivalents`` (docs/mutation.md): a full mutation run's
committed record and the equivalents file. Constants the docs quote (``QUOTED``) are checked against
the code. A new recorded run (``python -m
infer_ref.conformance.engines.matrix --engines ... --out docs/engine-results``) changes them:
``--write`` after it; ``tests/unit/test_doc_figures.py`` fails while a block is stale.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from infer_ref.conformance.engines import power
from infer_ref.conformance.engines.matrix import recipe_results
from infer_ref.conformance.engines.matrix.main import engines_in
from infer_ref.conformance.engines.matrix.results import read_run
from infer_ref.conformance.engines.verdicts.tolerances import (
    MEASURED_SPREAD,
    agreement_tolerance,
    consistency_tolerance,
)
from infer_ref.conformance.tiers import EXACT_FLOAT64, FLOAT32_INTERMEDIATES
from infer_ref.fileio import replace_between_markers

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "engine-results"
MUTATION_RECORD = ROOT / "benchmarks" / "log" / "mutation.json"
SPREAD_RECORD = ROOT / "benchmarks" / "log" / "precision_spread.json"
CONTROL_ROW = "infer_ref (control copy)"
LARGEST = re.compile(
    r"^largest difference from the oracle: (?P<nats>[0-9.e+-]+) nats .*; tolerance (?P<tolerance>[0-9.e+-]+) "
)


def _report(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _largest_from_oracle(report: dict) -> tuple[str, str] | None:
    """(nats, tolerance) of the report's "largest difference from the oracle" note, if it has one."""
    for note in report.get("notes", []):
        found = LARGEST.match(note)
        if found:
            return found.group("nats"), found.group("tolerance")
    return None


def oracle_distances(results: Path = RESULTS) -> str:
    """docs/conformance.md's row: each float32 engine's largest distance from the oracle, within
    the tolerance, or past it (only where its xfails file lists the tests)."""
    within, past, tolerances = [], [], set()
    for engine in engines_in(results):
        report = _report(results / f"{engine}.json")
        largest = _largest_from_oracle(report)
        if report.get("dtype") != "float32" or largest is None:
            continue
        nats, tolerance = largest
        tolerances.add(tolerance)
        if float(nats) <= float(tolerance):
            within.append(f"{engine} {nats}")
            continue
        failed = report.get("totals", {}).get("counts", {}).get("failed", 0)
        past.append(
            f"{engine} {nats} ({f'{failed} failed' if failed else 'expected failures, its xfails file'})"
        )
    text = ", ".join(within)
    if past:
        text += "; past it: " + ", ".join(past)
    return "\n".join([
        "| dtype | tolerance (nats) | largest distance from the oracle in each engine's recorded run (docs/engine-results) |",
        "|---|---:|---|",
        f"| float32 | {' / '.join(sorted(tolerances))} | {text} |",
    ])  # fmt: skip


COUNTED = (("passed", "passed"), ("xfailed", "expected failures"), ("failed", "failed"),
           ("not supported", "not supported"), ("not judged", "not judged"), ("skipped", "skipped"))  # fmt: skip
LEFT_OUT = re.compile(r"^requests left out because .*?: (?P<left>[0-9]+ of [0-9]+) ")


def recorded_run(engine: str, results: Path = RESULTS) -> str:
    """One line for docs/engines.md's investigations: what ``engine``'s recorded run
    (``results/ENGINE.json`` and ``.xml``) counted, how many requests it left out, how long it ran."""
    report = _report(results / f"{engine}.json")
    if not report:
        raise SystemExit(f"{results / engine}.json: no recorded run of {engine}")
    counts = report.get("totals", {}).get("counts", {})
    said = [f"{counts[key]} {words}" for key, words in COUNTED if counts.get(key)] or ["no tests"]
    left = [found.group("left") for note in report.get("notes", []) if (found := LEFT_OUT.match(note))]
    if left:
        said.append(f"requests left out (an answer not readable as token ids): {left[0]}")
    ran = read_run(results / f"{engine}.xml")
    return f"`docs/engine-results/{engine}`: {', '.join(said)}" + (f"; {ran}." if ran else ".")


def recorded_runs(*engines: str) -> Callable[[], str]:
    """A block of :func:`recorded_run` lines, one per engine."""
    return lambda: "\n".join(recorded_run(engine) for engine in engines)


def long_context_counts(results: Path = RESULTS / "long") -> str:
    """docs/engines.md's long-context table: each engine's counts and largest distance from the
    oracle, from its recorded run of that workload."""
    columns = [words for _, words in COUNTED if words != "skipped"]
    rows = [f"| engine | {' | '.join(columns)} | largest distance from the oracle (nats) |",
            "|---|" + "---:|" * len(columns) + "---|"]  # fmt: skip
    for engine in engines_in(results):
        report = _report(results / f"{engine}.json")
        counts = report.get("totals", {}).get("counts", {})
        largest = _largest_from_oracle(report)
        cells = [str(counts.get(key, 0)) for key, words in COUNTED if words != "skipped"]
        rows.append(f"| {engine} | {' | '.join(cells)} | {largest[0] if largest else '–'} |")
    return "\n".join(rows)


def engine_run_times(results: Path = RESULTS) -> str:
    """docs/engines.md's table: each recorded run's time and date (JUnit), both workloads."""
    rows = ["| engine | default workload | long contexts |", "|---|---|---|"]
    for engine in engines_in(results):
        default = read_run(results / f"{engine}.xml").removeprefix("ran ") or "not recorded"
        long = read_run(results / "long" / f"{engine}.xml").removeprefix("ran ") or "not recorded"
        rows.append(f"| {engine} | {default} | {long} |")
    return "\n".join(rows)


def consistency_tolerances() -> str:
    """docs/conformance.md's self-consistency table: each engine's measured spread between two
    schedules (the registry's ``spread``) and the tolerance the tier judges it at."""
    rows = ["| engine, dtype | largest difference between two schedules | tolerance |", "|---|---:|---:|"]
    for (engine, dtype), spread in MEASURED_SPREAD.items():
        tolerance = consistency_tolerance(engine, dtype).value
        capped = " (the agreement tolerance)" if tolerance == agreement_tolerance(dtype) else ""
        rows.append(f"| {engine}, {dtype} | {spread:.3g} | {tolerance:.3g}{capped} |")
    return "\n".join(rows)


def _mutation_script() -> ModuleType:
    """scripts/mutation.py (no package: loaded by path), whose table writer the mutation blocks use."""
    spec = importlib.util.spec_from_file_location("mutation_script", ROOT / "scripts" / "mutation.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def mutation_scores(record: Path = MUTATION_RECORD) -> str:
    """docs/mutation.md's score tables, per part and per module, from a full run's committed record
    (``scripts/mutation.py figures --json``), or what to run where none is committed."""
    if not record.is_file():
        return (
            f"No full run is recorded ({record.relative_to(record.parents[2])} is not committed). A full run "
            "records it:\n\n"
            "```bash\n"
            'OUT=results JOBS=30 scripts/mutation_background.sh   # call again until it prints "done"\n'
            "cp results/figures.json benchmarks/log/mutation.json  # figures --json: the run's record\n"
            "python scripts/doc_figures.py --write                 # these tables, from that record\n"
            "```"
        )
    run = json.loads(record.read_text(encoding="utf-8"))
    markdown = _mutation_script().markdown
    parts = {part: Counter(row) for part, row in run["parts"].items()}
    modules = {module: Counter(row) for module, row in run["modules"].items()}
    return "\n".join([
        f"The full run recorded in `benchmarks/log/mutation.json`: tree {run['tree']}, {run['date']}.",
        "", markdown(parts), "", "Per module:", "", markdown(modules, by_module=True),
    ])  # fmt: skip


def mutation_equivalents() -> str:
    """How many mutants scripts/mutation_equivalent.txt lists (docs/mutation.md)."""
    return f"`scripts/mutation.py` reads this file; it lists {len(_mutation_script().equivalent())} mutants."


def _distance(value: float) -> str:
    """A distance as the float64 tables write it: ``1.4e-14``, ``0.77``, ``∞`` (the bug raised)."""
    if value == float("inf"):
        return "∞"
    return f"{value:.2g}" if value >= 0.01 else written(value, ".1e")


def _times(ratio: float) -> str:
    """A ratio to two significant digits, ``7,000×``."""
    return f"{round(float(f'{ratio:.2g}')):,}×"


def float64_spread(record: Path = SPREAD_RECORD) -> str:
    """docs/conformance.md's float64 tables, from the committed record of ``python -m
    infer_ref.conformance.precision_spread --examples 24 --mutants --json FILE``: each computation's
    worst distance from the float64 definition per family, the planted bugs', and the two tiers'
    tolerances against them. A bug "shows" in a family where it moves logits past ``EXACT_FLOAT64``."""
    run = json.loads(record.read_text(encoding="utf-8"))
    rows: dict[str, dict[str, float]] = run["rows"]
    families = list(rows[CONTROL_ROW])
    names = list(rows)
    # the definition first, then the float32-step variants, the control copy, the planted bugs
    variants = names[1 : names.index(CONTROL_ROW)]
    bugs = {name: rows[name] for name in names[names.index(CONTROL_ROW) + 1 :]}
    shown = {name: {f: d for f, d in row.items() if d > EXACT_FLOAT64} for name, row in bugs.items()}
    nearest = min((name for name in shown if shown[name]), key=lambda name: min(shown[name].values()))
    others = [shown[name] for name in shown if shown[name] and name != nearest]

    def cells(values: list[str]) -> str:
        return " | ".join(values) + " |"

    def others_in(family: str) -> str:
        seen = [row[family] for row in others if family in row]
        return f"{_distance(min(seen))} – {_distance(max(seen))}" if seen else "–"

    spread = max(d for name in variants for d in rows[name].values())
    exact = max(rows[CONTROL_ROW].values())
    bug = min(shown[nearest].values())
    hidden = [f"`{name}`" for name in shown if not shown[name]]
    return "\n".join([
        f"Recorded in `benchmarks/log/precision_spread.json` (`{run['command']} --json FILE`):",
        "",
        "| computation | " + cells(families),
        "|---|" + "---|" * len(families),
        "| infer_ref (the mutant machinery's control copy, through its cache) | "
        + cells([_distance(rows[CONTROL_ROW][f]) for f in families]),
        *(f"| {name} | " + cells([_distance(rows[name][f]) for f in families]) for name in variants),
        f"| nearest planted bug (`{nearest}`; –: it does not show in that family) | "
        + cells([_distance(shown[nearest][f]) if f in shown[nearest] else "–" for f in families]),
        "| every other planted bug of the model tier | " + cells([others_in(f) for f in families]),
        "",
        "(∞: the bug raised, e.g. `advance_twice` overflowing its cache. "
        + f"{' and '.join(hidden) or 'None'} do{'es' if len(hidden) == 1 else ''} not show in a fresh float64 run — "
        + "other tests catch them (docs/mutation.md).)",
        "",
        "| tier | tolerance (`infer_ref/conformance/tiers.py`) | why |",
        "|---|---|---|",
        f"| exact float64 | {written(EXACT_FLOAT64)} | correct float64 computations differ by summation order: "
        f"{_distance(exact)} measured; {written(EXACT_FLOAT64)} leaves room for longer sums and other kernels |",
        f"| float64 with float32 intermediates | {written(FLOAT32_INTERMEDIATES, '.0e')} | "
        f"{_times(FLOAT32_INTERMEDIATES / spread)} the largest float32-step spread ({_distance(spread)}), "
        f"{_times(bug / FLOAT32_INTERMEDIATES)} below the nearest planted bug ({_distance(bug)}) |",
    ])  # fmt: skip


def recipe_block(folder: str, name: str) -> Callable[[], str]:
    """docs/low-precision.md's recipe verdicts per engine (or per planted bug), from the report JSONs
    in ``folder`` (:mod:`infer_ref.conformance.engines.matrix.recipe_results` writes the same)."""

    def make() -> str:
        return recipe_results.block(recipe_results.load_reports(ROOT / folder), Path(folder), name)

    return make


def power_table(record: Path = RESULTS / "power.json") -> str:
    """docs/low-precision.md's power block from the committed runs (``power --from-runs`` writes the same)."""
    return power.markdown(json.loads(record.read_text()))


# block name -> (the page it is in, what makes it)
BLOCKS: dict[str, tuple[str, Callable[[], str]]] = {
    "oracle-distances": ("docs/conformance.md", oracle_distances),
    "engine-run-times": ("docs/engines.md", engine_run_times),
    "long-context-counts": ("docs/engines.md", long_context_counts),
    "recorded-run-llama.cpp-server": ("docs/engines.md", recorded_runs("llama.cpp-server")),
    "recorded-runs-llama.cpp-low-precision": (
        "docs/engines.md",
        recorded_runs("llama.cpp-float16", "llama.cpp-bfloat16"),
    ),
    "recorded-run-openvino": ("docs/engines.md", recorded_runs("openvino")),
    "consistency-tolerances": ("docs/conformance.md", consistency_tolerances),
    "float64-spread": ("docs/conformance.md", float64_spread),
    "mutation-scores": ("docs/mutation.md", mutation_scores),
    "mutation-equivalents": ("docs/mutation.md", mutation_equivalents),
    "power": ("docs/low-precision.md", power_table),
    "recipe-engines": ("docs/low-precision.md", recipe_block("docs/engine-results/recipe", "recipe-engines")),
    "recipe-planted": (
        "docs/low-precision.md",
        recipe_block("docs/engine-results/recipe-planted", "recipe-planted"),
    ),
}


# A tolerance the docs quote is the code's constant: (page, constant's name, its value); the page
# must write it as "VALUE (`NAME`".
QUOTED: tuple[tuple[str, str, float], ...] = (
    ("README.md", "EXACT_FLOAT64", EXACT_FLOAT64),
    ("CONTRIBUTING.md", "EXACT_FLOAT64", EXACT_FLOAT64),
)


def pages() -> set[str]:
    """Every page a block or a quoted constant is in."""
    return {page for page, _ in BLOCKS.values()} | {page for page, _, _ in QUOTED}


def written(value: float, spec: str = "g") -> str:
    """``value`` formatted by ``spec`` as the docs write it: ``1e-09`` as ``1e-9``."""
    return re.sub(r"e([+-])0+(?=[0-9])", r"e\1", format(value, spec))


def misquoted_constants(root: Path = ROOT) -> list[str]:
    """The pages that do not quote a constant as the code defines it, as ``page: NAME is VALUE``."""
    return [
        f"{page}: {name} is {written(value)}"
        for page, name, value in QUOTED
        if f"{written(value)} (`{name}`" not in (root / page).read_text(encoding="utf-8")
    ]


def block_in(page: Path, name: str) -> str:
    """The text between ``<!-- NAME:start -->`` and ``<!-- NAME:end -->`` in ``page`` (no newlines around)."""
    text = page.read_text(encoding="utf-8")
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    if start not in text or end not in text:
        raise SystemExit(f"{page}: no {start} ... {end} block")
    return text.split(start, 1)[1].split(end, 1)[0].strip("\n")


def stale_blocks(root: Path = ROOT) -> list[str]:
    """The blocks whose page does not hold what the committed results give, as ``page: name``, and
    the constants a page quotes otherwise than the code defines them."""
    stale = [
        f"{page}: {name}" for name, (page, make) in BLOCKS.items() if block_in(root / page, name) != make()
    ]
    return stale + misquoted_constants(root)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite the blocks in the docs")
    parser.add_argument("--check", action="store_true", help="exit 1 when a block is stale")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_blocks()
        for block in stale:
            print(f"stale: {block} (python scripts/doc_figures.py --write)", file=sys.stderr)
        return 1 if stale else 0
    for name, (page, make) in BLOCKS.items():
        if args.write:
            replace_between_markers(ROOT / page, name, make())
        else:
            print(f"{page}, {name}:\n{make()}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
