"""The markdown of ``infer-ref golden report``: tolerances, results, margins, the planted bug."""

from __future__ import annotations

import argparse
import datetime
import math
from pathlib import Path
from typing import Any

from infer_ref.cli.golden.shared import EXIT_MISMATCH


def _fmt(x: float) -> str:
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return str(x)
    return f"{x:.3g}"


def markdown(
    rows: list[dict[str, Any]],
    files_meta: list[dict[str, Any]],
    planted: dict[str, Any] | None,
    device: str | None,
    seconds: float,
    args: argparse.Namespace,
) -> str:
    import platform

    import torch
    import transformers

    from infer_ref.conformance.oracles import golden
    from infer_ref.devices import default_device

    dev = device or str(default_device())
    lines = [
        "# Golden files: verification report",
        "",
        f"Written by `python -m infer_ref.cli.golden report` on {datetime.date.today().isoformat()} "
        f"({seconds:.0f} s). Regenerate with `scripts/gpu_goldens.sh`.",
        "",
        f"- device: {golden.device_name(dev)}",
        f"- torch {torch.__version__}, transformers {transformers.__version__}, python {platform.python_version()}",
        "",
        "Verification is teacher-forced through each implementation's own KV cache: a step passes when the "
        "golden token's logprob is within eps of the implementation's best (tie-aware) and the golden top-k "
        "logprobs are within the top-k tolerance. *Free-running match* is the number of leading steps whose "
        "argmax equals the golden token (what greedy decoding would reproduce exactly). *Max deficit* is the "
        "largest (our best logprob - our logprob of the golden token). *Min margin* is the smallest golden "
        "top1-top2 logprob gap. `transformers-uncached` recomputes the full sequence at every step: it measures "
        "the cached-vs-uncached noise of the dtype and is reported, not gated.",
        "",
        "## Tolerances",
        "",
        "| dtype | eps | top-k atol | why |",
        "|---|---|---|---|",
    ]
    for name, tol in golden.TOLERANCES.items():
        lines.append(f"| {name} | {tol.eps} | {tol.topk_atol} | {tol.why} |")
    lines += ["", "## Results", "", "| golden file | impl | result | free-running match per case | max abs dlogprob | max deficit | min margin | s |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        rep = r.get("report")
        name = Path(r["file"]).name
        if rep is None:
            first = r["message"].splitlines()[0]
            lines.append(f"| {name} | {r['impl']} | ERROR (exit {r['code']}): {first} | | | | | |")
            continue
        match = ", ".join(f"{c.free_match}/{c.steps}" for c in rep.cases)
        status = "pass" if rep.ok else "**FAIL**"
        lines.append(
            f"| {name} | {r['impl']} | {status} | {match} | {_fmt(rep.max_abs_dlogprob)} | {_fmt(rep.max_deficit)} "
            f"| {_fmt(rep.min_golden_margin)} | {r['seconds']:.0f} |"
        )
    lines += [
        "",
        "## Golden margin distribution (top1 - top2 logprob, nats, over all steps)",
        "",
        "| golden file | model | cases (prompt+new) | min | p1 | p5 | p25 | median | generated on |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for m in files_meta:
        pct = " | ".join(_fmt(v) for v in m["margins"])
        lines.append(f"| {Path(m['file']).name} | {m['model']} ({m['source']}) | {m['cases']} | {pct} | {m['generated_on']} |")
    if planted:
        verdict = (
            "caught: verification fails with a real mismatch (GoldenMismatch)"
            if planted["code"] == EXIT_MISMATCH
            else f"NOT caught as a mismatch (exit {planted['code']})"
        )
        lines += [
            "",
            f"## Planted bug: `{planted['bug']}`",
            "",
            f"infer_ref with the bug planted, verified against `{Path(planted['file']).name}`: {verdict}. The message:",
            "",
            "```",
            planted["message"],
            "```",
        ]
    failures = [r for r in rows if r.get("report") is not None and not r["report"].ok] + [
        r for r in rows if r.get("report") is None
    ]
    if failures:
        lines += ["", "## Failure details", ""]
        for r in failures:
            lines += ["```", r["message"], "```", ""]
    if getattr(args, "pytest_log", None) and Path(args.pytest_log).is_file():
        tail = Path(args.pytest_log).read_text(encoding="utf-8", errors="replace").strip().splitlines()[-15:]
        lines += ["", "## GPU-tier golden tests (`pytest -m gpu tests/golden`), last lines", "", "```", *tail, "```"]
    return "\n".join(lines) + "\n"
