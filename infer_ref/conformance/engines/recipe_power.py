"""What the signed statistics see of each low-precision recipe bug: ``python -m
infer_ref.conformance.engines.recipe_power``.

On each numerics checkpoint (:mod:`~infer_ref.conformance.engines.workloads.numerics_checkpoints`), in each
low dtype its design is for, infer_ref's model runs a fixed prompt set (teacher forcing, every
position's logprobs) under every legitimate recipe and every recipe bug of
:mod:`~infer_ref.conformance.engines.recipes`, and under float32 (an engine more exact than the
canonical recipe). Each run is compared with infer_ref's model in float64 on the same weights: the
temperature slope, the chosen token's signed logprob error, the KL mean and, on the long prompts,
the KL late/early ratio (:mod:`~infer_ref.conformance.engines.verdicts.signed_statistics`), each with its
cluster-robust standard error. The legitimate recipes calibrate a centre and a spread per
statistic, checkpoint and dtype; a bug is *caught* where a statistic deviates beyond 3 spreads with
|t| > 5 (:func:`~infer_ref.conformance.engines.verdicts.signed_statistics.judge`). Written: the recipe-power
block of docs/low-precision.md, the centres and spreads the engine tier judges by
(``recipe_calibration.json``), and every run's statistics with ``--json``. One thread, about a
minute per checkpoint and dtype.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor

from infer_ref.conformance.engines.numerics_workload import (
    CALIBRATION,
    EXACT_VALUES,
    TOP_K,
    judge_run,
    prompt_set,
    run_statistics,
)
from infer_ref.conformance.engines.protocol import TokenLogprobs
from infer_ref.conformance.engines.recipes import BUGS, LEGITIMATE, Recipe, patched
from infer_ref.conformance.engines.verdicts.signed_statistics import Calibration, Estimate
from infer_ref.conformance.engines.workloads.checkpoints import EngineCheckpoint, write_all
from infer_ref.conformance.engines.workloads.folders import engine_checkpoints_root
from infer_ref.conformance.engines.workloads.numerics_checkpoints import (
    DESIGNED_FOR,
    NUMERICS_CHECKPOINTS,
    NUMERICS_STYLE,
)
from infer_ref.fileio import replace_between_markers
from infer_ref.loader import load_model

COMMAND = "python -m infer_ref.conformance.engines.recipe_power"
DOC = Path(__file__).resolve().parents[3] / "docs" / "low-precision.md"
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
FLOAT32 = "float32_engine"


# -- one run: logprobs and statistics -----------------------------------------------------------------


@torch.inference_mode()
def logprobs(
    folder: Path, dtype: torch.dtype, prompts: Sequence[tuple[int, ...]], recipe: Recipe | None
) -> list[Tensor]:
    """Every position's float64 log-softmax ``[T, V]`` of each prompt, infer_ref's model in ``dtype``
    with ``recipe`` applied (None: as it is)."""
    model, _ = load_model(folder, dtype=dtype, device="cpu")
    if recipe is not None:
        patched(model, recipe)
    return [model(torch.tensor([ids]))[0].double().log_softmax(-1) for ids in prompts]


def reported(engine: Tensor, prompt: tuple[int, ...]) -> list[TokenLogprobs | None]:
    """What an engine returns as prompt logprobs from its log-softmax ``[T, V]``: None at position 0,
    then the given token's logprob and the top-:data:`TOP_K`."""
    out: list[TokenLogprobs | None] = [None]
    for p in range(1, len(prompt)):
        row = engine[p - 1]
        top = tuple((int(t), float(row[t])) for t in row.topk(TOP_K).indices)
        out.append(TokenLogprobs(prompt[p], float(row[prompt[p]]), top))
    return out


def statistics(
    oracle: Sequence[Tensor], engine: Sequence[Tensor], prompts: Sequence[tuple[int, ...]], long: bool
) -> dict[str, Estimate]:
    """The statistics of ``engine``'s prompt logprobs against ``oracle``'s (``[T, V]`` per prompt),
    computed from what an engine would return, as the tier computes them."""
    positions = [
        (r, p, entry, lp_or[p - 1])
        for r, (lp_or, lp_eng, prompt) in enumerate(zip(oracle, engine, prompts, strict=True))
        for p, entry in enumerate(reported(lp_eng, prompt))
        if entry is not None
    ]
    return run_statistics(positions, long)


# -- one checkpoint in one dtype ----------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One recipe's statistics on one checkpoint in one dtype, judged against the legitimate ones."""

    checkpoint: str
    dtype: str
    recipe: str
    kind: str  # "legitimate" | "bug" | "more exact"
    estimates: dict[str, tuple[float, float]]  # statistic -> (value, SE)
    judged: dict[str, tuple[float, float, bool]]  # statistic -> (spreads, t, deviates)

    @property
    def caught(self) -> bool:
        return any(d for _, _, d in self.judged.values())

    def strongest(self) -> tuple[str, float, float]:
        """The statistic deviating most, in spreads (its name, spreads, t)."""
        name = max(self.judged, key=lambda k: (self.judged[k][2], abs(self.judged[k][0])))
        return name, self.judged[name][0], self.judged[name][1]


def measure(
    spec: EngineCheckpoint, folder: Path, dtype: str, progress: bool = True
) -> tuple[list[Row], dict[str, Calibration]]:
    """Every applicable recipe on ``spec`` in ``dtype`` (the legitimate ones, the bugs, and float32),
    and each statistic's calibration over the legitimate ones."""
    config = json.loads((folder / "config.json").read_text())
    work = prompt_set(spec)
    prompts = work.prompts(config["vocab_size"])
    oracle = logprobs(folder, torch.float64, prompts, None)
    runs: list[tuple[str, str, dict[str, Estimate]]] = []
    todo = [("legitimate", r) for r in LEGITIMATE] + [("bug", r) for r in BUGS]
    for kind, recipe in todo:
        if recipe.applies_to(config["model_type"], dtype):
            engine = logprobs(folder, DTYPES[dtype], prompts, recipe)
            runs.append((recipe.name, kind, statistics(oracle, engine, prompts, work.long)))
            if progress:
                print(f"  {spec.name} {dtype} {recipe.name}", flush=True)
    runs.append(
        (
            FLOAT32,
            "more exact",
            statistics(oracle, logprobs(folder, torch.float32, prompts, None), prompts, work.long),
        )
    )
    calibrations = {
        name: Calibration.of([stats[name].value for _, kind, stats in runs if kind == "legitimate"])
        for name in runs[0][2]
    }
    rows = []
    for recipe_name, kind, stats in runs:
        judged = judge_run(stats, calibrations)
        rows.append(
            Row(
                spec.name,
                dtype,
                recipe_name,
                kind,
                {k: (e.value, e.se) for k, e in stats.items()},
                {k: (j.spreads, j.t, j.deviates) for k, j in judged.items()},
            )
        )
    return rows, calibrations


# -- the table ------------------------------------------------------------------------------------------

_SHORT_NAMES = {"slope": "slope", "chosen_error": "chosen", "kl_mean": "KL", "kl_late_early": "KL late/early"}


def markdown(rows: Sequence[Row]) -> str:
    """The bug class x dtype table (each bug's strongest statistic over the checkpoints), then every
    run's deviations in spreads."""
    lines = [
        f"Generated by `{COMMAND}`: infer_ref's model under each recipe on the numerics checkpoints, "
        "against its float64 run on the same weights. Deviation from the legitimate recipes' centre in "
        "calibrated spreads (t in its own standard errors); ✔ caught: beyond 3 spreads with |t| > 5 and "
        "not between the centre and the exact value.",
        "",
        "| recipe bug | bfloat16 | float16 |",
        "|---|---|---|",
    ]
    for bug in BUGS:
        cells = []
        for dtype in DTYPES:
            mine = [r for r in rows if r.recipe == bug.name and r.dtype == dtype]
            if not mine:
                cells.append(
                    "not exercised"
                    if not bug.applies_to("gemma3_text", dtype) and not bug.applies_to("llama", dtype)
                    else "not run"
                )
                continue
            best = max(mine, key=lambda r: (r.caught, abs(r.strongest()[1])))
            name, spreads, t = best.strongest()
            mark = "✔" if best.caught else "✘"
            cells.append(
                f"{mark} {spreads:+.1f} spreads (t {t:+.0f}), {_SHORT_NAMES[name]} on {best.checkpoint}"
            )
        lines.append(f"| {bug.name} | " + " | ".join(cells) + " |")
    flagged = [r for r in rows if r.kind != "bug" and r.caught]
    lines += [
        "",
        "Legitimate recipes and float32 flagged: "
        + (", ".join(f"{r.recipe} on {r.checkpoint} ({r.dtype})" for r in flagged) if flagged else "none")
        + ".",
        "",
    ]
    stats = list(EXACT_VALUES)
    lines += [
        "| checkpoint | dtype | recipe | " + " | ".join(_SHORT_NAMES[s] for s in stats) + " |",
        "|---|---|---|" + "---|" * len(stats),
    ]
    for r in rows:
        cells = []
        for s in stats:
            if s not in r.judged:
                cells.append("")
                continue
            spreads, t, deviates = r.judged[s]
            cells.append(f"{'**' if deviates else ''}{spreads:+.1f} ({t:+.0f}){'**' if deviates else ''}")
        lines.append(f"| {r.checkpoint} | {r.dtype} | {r.recipe} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--only", action="append", help="numerics checkpoint names (default: all)")
    parser.add_argument(
        "--dtype", action="append", choices=list(DTYPES), help="default: those each is designed for"
    )
    parser.add_argument("--json", type=Path, default=None, help="write every run's statistics here")
    parser.add_argument(
        "--doc", type=Path, default=DOC, help="the page whose recipe-power block is rewritten"
    )
    parser.add_argument(
        "--calibration", type=Path, default=CALIBRATION, help="where centres and spreads are written"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    known = {s.name for s in NUMERICS_CHECKPOINTS}
    unknown = sorted(set(args.only or ()) - known)
    if unknown:
        parser.error(
            f"--only {', '.join(unknown)}: not a numerics checkpoint; known: {', '.join(sorted(known))}"
        )
    specs = [s for s in NUMERICS_CHECKPOINTS if not args.only or s.name in args.only]
    folders = write_all(engine_checkpoints_root(), print, specs=specs, styles=(NUMERICS_STYLE,))
    rows: list[Row] = []
    calibration: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
    for spec, folder in zip(specs, folders, strict=True):
        for dtype in DESIGNED_FOR[spec.name]:
            if not args.dtype or dtype in args.dtype:
                measured, calibrations = measure(spec, folder, dtype)
                rows += measured
                calibration.setdefault(spec.name, {})[dtype] = {k: asdict(c) for k, c in calibrations.items()}
    for r in rows:
        print(
            f"{r.checkpoint} {r.dtype} {r.recipe}: "
            + ", ".join(
                f"{k} {s:+.1f} spreads (t {t:+.1f}){' DEVIATES' if d else ''}"
                for k, (s, t, d) in r.judged.items()
            )
        )
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")
    if not args.only and not args.dtype:
        replace_between_markers(args.doc, "recipe-power", markdown(rows))
        table = {"command": COMMAND, "calibration": calibration}
        args.calibration.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        print(f"wrote the recipe-power block of {args.doc} and the calibration {args.calibration}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    raise SystemExit(main())
