"""The engine tier's failures in a few lines: one line per failed test (what differed: the request,
its prompt length, the step or prompt position, the engine's logprob against the oracle's), the
command that reruns the most telling one, and the terminal's short report.

pytest's own text of a failure is the kit's traceback through its verdicts; the terminal shows it
only with ``--ir-tracebacks`` (``infer-ref conformance --tracebacks``). Every command printed runs
wherever the kit is installed: ``pytest --pyargs`` and the package's test module, never a path of
a checkout.
"""

from __future__ import annotations

from collections.abc import Sequence

from infer_ref.conformance.report import Observed, Report, verdict_line
from infer_ref.conformance.rerun import pyargs_command

MOST_FAILURES_LISTED = 8  # the rest counted: the --report file lists every table
LINE_WIDTH = 220


def what_differed(text: str) -> str:
    """One line of a failure's message: its headline and the first finding of its first detail.

    ``1 of 17 requests disagree with the oracle (tolerance 0.0002):`` / ``request 15 (38 prompt tokens,
    tolerance 0.0002): step 3: logprob of token 220: engine -0.000320, oracle -10.665799 (|diff| 10.7);
    step 3: ...`` -> ``1 of 17 requests disagree with the oracle (tolerance 0.0002): request 15 (38
    prompt tokens, tolerance 0.0002): step 3: logprob of token 220: engine -0.000320, oracle
    -10.665799 (|diff| 10.7)``."""
    lines = [line.strip() for line in text.strip().splitlines()]
    kept = [line for line in lines if line and not line.startswith(("repro:", "assert ", "+", "where "))]
    if not kept:
        return "(no message)"
    headline = kept[0].removeprefix("AssertionError: ").rstrip(":")
    detail = kept[1].split("; ")[0] if len(kept) > 1 else ""
    line = f"{headline}: {detail}" if detail else headline
    return line if len(line) <= LINE_WIDTH else line[: LINE_WIDTH - 1] + "…"


def failure_lines(failed: Sequence[Observed]) -> list[str]:
    """``test[checkpoint]: what differed``, one per failed test (the first few; the rest counted)."""
    out = [f"`{o.nodeid.partition('::')[2]}`: {what_differed(o.text)}" for o in failed[:MOST_FAILURES_LISTED]]
    if len(failed) > MOST_FAILURES_LISTED:
        out.append(
            f"… and {len(failed) - MOST_FAILURES_LISTED} more failed tests (the --report file's tables list them)"
        )
    return out


def repro_command(failure: Observed, selects: str) -> str:
    """The pytest command that reruns ``failure`` on the same engine and checkpoint, from a wheel
    install as from a checkout: the verdict's own ``repro: pytest --pyargs ...`` line where its message
    has one, else one made from the test's id (``selects``: the run's engine options)."""
    for line in failure.text.splitlines():
        command = line.strip().removeprefix("E").strip()
        if command.startswith("repro: pytest --pyargs "):
            return command.removeprefix("repro: ")
    return pyargs_command(failure.nodeid, selects)


def script_of(failure_text: str) -> str | None:
    """The standalone repro script a verdict wrote (``repro: python FILE``), if any."""
    for line in failure_text.splitlines():
        if line.strip().startswith("repro: python "):
            return line.strip().removeprefix("repro: ")
    return None


def terminal_lines(report: Report) -> list[str]:
    """The engine tier's report in the terminal: totals, the verdict, the named bug class and why,
    the failures one line each, one repro command (and its script), the other candidates and the
    classes the engine cannot exhibit; the full tables go to ``--report FILE``."""
    lines = [f"totals: {_counts(report)}", verdict_line(report).replace("**", "")]
    if report.most_likely:
        lines.append(f"most likely bug class: {report.most_likely} ({report.most_likely_why})")
    if report.failures:
        lines += ["failures (what differed):", *(f"- {f}" for f in report.failures)]
    if report.repro:
        lines.append(f"repro: {report.repro}")
    if report.repro_script:
        lines.append(f"  or without the kit's pytest run: {report.repro_script}")
    for verdict in ("as likely", "less likely"):
        names = [name for name, b in report.blame.items() if b["verdict"] == verdict]
        if names:
            more = f"; {len(names) - 3} more" if len(names) > 3 else ""
            lines.append(f"{verdict} (one bug assumed): {'; '.join(names[:3])}{more}")
    if report.cannot_exhibit:
        lines.append(
            "cannot exhibit (not judged): "
            + "; ".join(f"{c} (lacks {why})" for c, why in report.cannot_exhibit.items())
        )
    lines += [n for n in report.notes if n.startswith("largest difference from the oracle")]
    lines.append(
        "every table and note: --report FILE.md (pytest: --ir-report); the failures' tracebacks: --tracebacks "
        "(pytest: --ir-tracebacks)"
    )
    return lines


def _counts(report: Report) -> str:
    return ", ".join(f"{n} {k}" for k, n in report.totals.counts.items() if n) or "nothing ran"


__all__ = ["failure_lines", "repro_command", "script_of", "terminal_lines", "what_differed"]
