"""Calibrate the low-precision verdict on correct implementations.

``python -m infer_ref.conformance.engines.calibrate``.

For every kit checkpoint, in bfloat16 and float16, the agreement workload
(:func:`~infer_ref.conformance.engines.workloads.prompts.agreement_workload`) runs through each
implementation of :data:`CALIBRATION_ENGINES` — infer_ref's Engine in both of the tier's starts
and transformers' ``generate`` with SDPA and with eager attention, each correct in float32 to 5e-5
nats — and every position is summarised (:mod:`~infer_ref.conformance.engines.verdicts.distribution`).

A statistic's threshold is :data:`MARGIN` times the worst, over those implementations, of its
99.9th bootstrap percentile (requests resampled with replacement, :data:`RESAMPLES` times): the
value an engine rounding like them would reach in one run in a thousand, tripled for engines that
round differently (other kernels, other devices: between transformers and infer_ref the 99th
percentile of KL differs by up to 2.3x on one checkpoint). For the share of same top tokens the
margin applies to the share that differs, which is never taken below ``-ln(0.001) / n`` (the
99.9% upper bound on a rate of which none of ``n`` positions were seen). Written:

- :data:`~infer_ref.conformance.engines.verdicts.thresholds.TABLE` (the JSON the tier reads);
- the calibration block of docs/low-precision.md: every implementation's summary, the thresholds,
  each implementation judged by the thresholds of the *others* (leave one out), and the share of
  bootstrap resamples of each correct run that any threshold fails (the false-alarm estimate).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import torch

from infer_ref.conformance.engines.protocol import EngineHandle
from infer_ref.conformance.engines.session import declared_capabilities, load_factory
from infer_ref.conformance.engines.verdicts.distribution import (
    LOWER_IS_WORSE,
    PositionStat,
    Summary,
    quantile,
    summarise,
)
from infer_ref.conformance.engines.verdicts.positions import judged_positions, of_kind
from infer_ref.conformance.engines.verdicts.thresholds import JUDGED, KINDS, TABLE
from infer_ref.conformance.engines.verdicts.tolerances import LOW_PRECISION
from infer_ref.conformance.engines.workloads.folders import default_model_dirs
from infer_ref.conformance.engines.workloads.geometry import options_for
from infer_ref.conformance.engines.workloads.prompts import (
    PROMPT_LOGPROBS,
    agreement_workload,
    continued_turns,
    first_turns,
    model_facts,
)
from infer_ref.fileio import replace_between_markers

COMMAND = "python -m infer_ref.conformance.engines.calibrate"
DOC = Path(__file__).resolve().parents[3] / "docs" / "low-precision.md"
MARGIN = 3.0
RESAMPLES = 1000
PERCENTILE = 0.999
# name -> (engine registry name, tier start): the implementations trusted to be correct.
CALIBRATION_ENGINES = {
    "infer_ref plain": ("infer_ref", "plain", {}),
    "infer_ref stressed": ("infer_ref", "stressed", {}),
    "transformers sdpa": ("transformers", "plain", {"attn_implementation": "sdpa"}),
    "transformers eager": ("transformers", "plain", {"attn_implementation": "eager"}),
}

Requests = list[list[PositionStat]]  # one list of positions per request


@dataclass(frozen=True)
class Run:
    """One correct implementation's positions on one checkpoint, dtype and kind."""

    engine: str
    checkpoint: str
    dtype: str
    kind: str
    requests: Requests

    @property
    def summary(self) -> Summary:
        return summarise([p for r in self.requests for p in r])


def collect(model_dir: Path, dtype: str, engine: str) -> dict[str, Requests]:
    """``engine``'s positions on ``model_dir`` in ``dtype``, split by kind (a kind it cannot report is
    absent)."""
    name, kind, keywords = CALIBRATION_ENGINES[engine]
    factory = load_factory(name)
    capabilities = declared_capabilities(factory)
    handle: EngineHandle = factory(model_dir, options_for(kind, dtype, capabilities), **keywords)
    facts, ignore_eos = model_facts(model_dir), "ignore_eos" in capabilities
    try:
        wants = PROMPT_LOGPROBS if "prompt_logprobs" in capabilities else None
        requests = agreement_workload(facts, ignore_eos=ignore_eos, prompt_logprobs=wants)
        outputs = handle.generate(requests)
        first = first_turns(facts, ignore_eos=ignore_eos)
        continued = continued_turns(facts, first, handle.generate(first), ignore_eos=ignore_eos)
        continued_outputs = handle.generate(
            continued
        )  # on a prefix-caching start, the first turns are cached
    finally:
        handle.stop()
    by_kind: dict[str, Requests] = {k: [] for k in KINDS}
    for i, (request, output) in enumerate(zip(requests, outputs, strict=True)):
        positions = judged_positions(model_dir, i, request, output)
        for kind in ("generated", "prompt"):
            by_kind[kind].append([p.stat() for p in of_kind(positions, kind)])
    for i, (request, output) in enumerate(zip(continued, continued_outputs, strict=True)):
        by_kind["continued"].append([p.stat() for p in judged_positions(model_dir, i, request, output)])
    return {k: v for k, v in by_kind.items() if any(v)}


def bootstrap_percentiles(requests: Requests, rng: random.Random) -> dict[str, float]:
    """Each judged statistic's :data:`PERCENTILE` (for ``same_top``: 1 - it, and no higher than the
    bound a rate none of the positions showed allows) over resampled requests."""
    draws: dict[str, list[float]] = {name: [] for name in JUDGED}
    for sample in _resamples(requests, rng):
        summary = summarise(sample)
        for name in JUDGED:
            draws[name].append(getattr(summary, name))
    out = {
        name: quantile(sorted(v), 1 - PERCENTILE if name in LOWER_IS_WORSE else PERCENTILE)
        for name, v in draws.items()
    }
    positions = sum(len(r) for r in requests)
    out["same_top"] = min(out["same_top"], 1.0 + math.log(1.0 - PERCENTILE) / positions)
    return out


def thresholds_from(percentiles: Sequence[dict[str, float]]) -> dict[str, float]:
    """:data:`MARGIN` over the worst of ``percentiles`` (one dict per implementation)."""
    out = {}
    for name in JUDGED:
        if name in LOWER_IS_WORSE:
            out[name] = max(0.0, 1.0 - MARGIN * max(1.0 - p[name] for p in percentiles))
        else:
            out[name] = MARGIN * max(p[name] for p in percentiles)
    return out


def false_alarm_rate(requests: Requests, thresholds: dict[str, float], rng: random.Random) -> float:
    """The share of bootstrap resamples of a correct run that fail any threshold."""
    failed = 0
    for sample in _resamples(requests, rng):
        summary = summarise(sample)
        failed += any(_fails(name, getattr(summary, name), t) for name, t in thresholds.items())
    return failed / RESAMPLES


def _fails(name: str, value: float, threshold: float) -> bool:
    return value < threshold if name in LOWER_IS_WORSE else not value <= threshold


def _resamples(requests: Requests, rng: random.Random) -> list[list[PositionStat]]:
    kept = [r for r in requests if r]
    return [[p for _ in kept for p in kept[rng.randrange(len(kept))]] for _ in range(RESAMPLES)]


def calibrate(
    model_dirs: Sequence[Path], dtypes: Sequence[str], engines: Sequence[str], log: Callable[[str], None]
) -> dict:
    """Every run, the thresholds from them, and the checks of those thresholds on them."""
    runs: list[Run] = []
    for model_dir in model_dirs:
        for dtype in dtypes:
            for engine in engines:
                for kind, requests in collect(model_dir, dtype, engine).items():
                    runs.append(Run(engine, model_dir.name, dtype, kind, requests))
                log(f"{model_dir.name} {dtype} {engine}: done")
    table: dict = {
        "command": COMMAND,
        "date": date.today().isoformat(),
        "torch": torch.__version__,
        "margin": MARGIN,
        "resamples": RESAMPLES,
        "percentile": PERCENTILE,
        "engines": list(engines),
        "thresholds": {},
        "runs": [],
    }
    for key in sorted({(r.dtype, r.kind, r.checkpoint) for r in runs}):
        group = [r for r in runs if (r.dtype, r.kind, r.checkpoint) == key]
        # Resamples seeded per group: adding a checkpoint, kind or engine leaves the others' thresholds as
        # they were.
        percentiles = {
            r.engine: bootstrap_percentiles(r.requests, random.Random(f"{key}/{r.engine}")) for r in group
        }
        thresholds = thresholds_from(list(percentiles.values()))
        table["thresholds"].setdefault(key[0], {}).setdefault(key[1], {})[key[2]] = thresholds
        for r in group:
            others = [p for e, p in percentiles.items() if e != r.engine]
            left_out = thresholds_from(others) if others else None
            table["runs"].append(
                {
                    "engine": r.engine,
                    "dtype": r.dtype,
                    "kind": r.kind,
                    "checkpoint": r.checkpoint,
                    "summary": r.summary.as_dict(),
                    "false_alarm": false_alarm_rate(
                        r.requests, thresholds, random.Random(f"{key}/{r.engine}/check")
                    ),
                    "passes_others_thresholds": None
                    if left_out is None
                    else not any(_fails(n, getattr(r.summary, n), t) for n, t in left_out.items()),
                }
            )
    return table


def markdown(table: dict) -> str:
    """The calibration block of docs/low-precision.md."""
    lines = [
        f"Generated by `{table['command']}` on {table['date']} (torch {table['torch']}, CPU): thresholds = "
        f"{table['margin']:g} x "
        f"the worst {table['percentile'] * 100:g}th bootstrap percentile ({table['resamples']} resamples of "
        "the requests) of "
        f"{', '.join(table['engines'])}.",
        "",
        "| dtype | positions | checkpoint | engine | positions judged | KL mean | KL median | KL p99 | KL "
        "max | logprob error max | same top | false alarms | passes the others' thresholds |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in table["runs"]:
        s = run["summary"]
        others = {None: "—", True: "yes", False: "**no**"}[run["passes_others_thresholds"]]
        lines.append(
            f"| {run['dtype']} | {run['kind']} | {run['checkpoint']} | {run['engine']} | {s['positions']} | "
            f"{s['kl_mean']:.2e} | "
            f"{s['kl_median']:.2e} | {s['kl_p99']:.2e} | {s['kl_max']:.2e} | {s['logprob_error_max']:.3f} | "
            f"{s['same_top'] * 100:.1f}% | {run['false_alarm'] * table['resamples']:.0f} / "
            f"{table['resamples']} | {others} |"
        )
    lines += [
        "",
        "| dtype | positions | checkpoint | " + " | ".join(JUDGED) + " |",
        "|---|---|---|" + "---|" * len(JUDGED),
    ]
    for dtype, kinds in table["thresholds"].items():
        for kind, checkpoints in kinds.items():
            for checkpoint, t in checkpoints.items():
                cells = [f"{t[n] * 100:.1f}%" if n in LOWER_IS_WORSE else f"{t[n]:.3g}" for n in JUDGED]
                lines.append(f"| {dtype} | {kind} | {checkpoint} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--dtype", action="append", choices=LOW_PRECISION, help="default: both")
    parser.add_argument("--engine", action="append", choices=list(CALIBRATION_ENGINES), help="default: all")
    parser.add_argument("--table", type=Path, default=TABLE, help=f"the JSON written (default {TABLE})")
    parser.add_argument("--doc", type=Path, default=DOC, help="the page whose calibration block is rewritten")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    table = calibrate(
        default_model_dirs(lambda line: print(line, file=sys.stderr)),
        args.dtype or LOW_PRECISION,
        args.engine or list(CALIBRATION_ENGINES),
        lambda line: print(line, file=sys.stderr, flush=True),
    )
    args.table.write_text(json.dumps(table, indent=1) + "\n")
    replace_between_markers(args.doc, "calibration", markdown(table))
    print(f"wrote {args.table} and the calibration block of {args.doc}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
