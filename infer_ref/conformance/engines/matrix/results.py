"""One engine's tier results: every test case's outcome per checkpoint (from pytest's JUnit XML),
and, where the run wrote its report JSON (``--report E.json``), the engine's version and the
tolerances it was judged at (the report's notes)."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from infer_ref.errors import UsageError

# skipped: not supported, or not applicable; not judged: the engine could not be started or reached
OUTCOMES = ("passed", "xfailed", "failed", "not judged", "skipped")
NOT_JUDGED = "not judged:"  # how such a test's skip reason starts (infer_ref.conformance.report.NOT_JUDGED)
ENGINE_NOTE = "engine: "  # the report note naming the started engine (its version), see the tier's conftest
TOLERANCE_NOTES = ("largest difference from the oracle", "largest difference between two schedules")


@dataclass(frozen=True)
class Case:
    """One test case: ``test_agreement`` / ``test_generated_logprobs_agree_with_oracle`` on ``checkpoint``."""

    module: str
    test: str
    checkpoint: str
    outcome: str
    nodeid: str  # location independent: ``test_agreement.py::test_x[llama-tiny]``


@dataclass
class EngineResult:
    """What the matrix shows of one engine."""

    engine: str  # the tier's name for it (``vllm``) or a label for a variant (``vllm-served``)
    version: str  # the started engine's own name (``vllm 0.32.0 (offline)``), or "version not recorded"
    cases: list[Case]
    dtype: str = "float32"
    tolerances: list[str] = field(default_factory=list)  # the report's tolerance notes; none: not recorded
    remarks: list[str] = field(default_factory=list)  # how the results were read (xfails applied afterwards)
    run: str = ""  # how long the tier ran and when, from the JUnit testsuite ("" where not recorded)


def outcome_of(case: ET.Element) -> str:
    """A JUnit testcase's outcome: a strict xfail that passed is a failure, as pytest reports it."""
    tags = {child.tag for child in case}
    if tags & {"failure", "error"}:
        return "failed"
    skipped = case.find("skipped")
    if skipped is not None:
        if skipped.get("type") == "pytest.xfail":
            return "xfailed"
        return "not judged" if skipped.get("message", "").startswith(NOT_JUDGED) else "skipped"
    return "passed"


def read_junit(path: Path) -> list[Case]:
    """The engine-tier cases of a JUnit XML report (tests without a checkpoint are left out)."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as e:
        raise UsageError(
            f"{path}: not a readable JUnit XML report ({e}); expected pytest's --junitxml output"
        ) from None
    cases = []
    for element in root.iter("testcase"):
        match = re.match(r"(\w+)\[(.+)\]$", element.get("name", ""))
        if match is None:
            continue
        test, params = match.groups()
        properties = {p.get("name"): p.get("value") for p in element.iter("property")}
        # ir_family is the checkpoint folder; without it, a test's own parameter (max_tokens, k) follows the
        # folder
        checkpoint = properties.get("ir_family") or re.sub(r"-\d+$", "", params)
        module = element.get("classname", "").rsplit(".", 1)[-1]
        cases.append(
            Case(module, test, str(checkpoint), outcome_of(element), f"{module}.py::{element.get('name')}")
        )
    if not cases:
        raise UsageError(
            f"{path}: no engine-tier test cases (test_x[checkpoint]) in it; expected the --junitxml of "
            "`infer-ref conformance --engine E`"
        )
    return cases


def read_run(path: Path) -> str:
    """``"ran 97 s on 2026-11-27"``: the tier's wall time and date as its JUnit file records them."""
    try:
        suite = next(ET.parse(path).getroot().iter("testsuite"))
        seconds, day = float(suite.get("time", "")), suite.get("timestamp", "")[:10]
    except (OSError, ET.ParseError, StopIteration, ValueError):
        return ""
    return f"ran {seconds:.0f} s" + (f" on {day}" if day else "")


def read_report(path: Path) -> tuple[str | None, str, list[str]]:
    """``(engine version or None, dtype, tolerance notes)`` from a report JSON (``--report E.json``)."""
    try:
        report = json.loads(path.read_text())
        notes = [str(n) for n in report.get("notes", [])]
        dtype = str(report.get("dtype", "float32"))
    except (OSError, ValueError, AttributeError) as e:
        raise UsageError(
            f"{path}: not a conformance report JSON ({e}); expected the file `--report E.json` writes"
        ) from None
    version = next((n[len(ENGINE_NOTE) :] for n in notes if n.startswith(ENGINE_NOTE)), None)
    return version, dtype, [n for n in notes if n.startswith(TOLERANCE_NOTES)]


def apply_xfails(cases: Sequence[Case], prefixes: Sequence[str]) -> list[Case]:
    """The outcomes a run with these expected failures would have given: a listed failure is an
    expected one, a listed pass fails (the tier's xfails are strict). For results of a run made
    before the engine's xfails file existed."""
    from infer_ref.conformance.xfail_files import matches

    out = []
    for case in cases:
        if case.outcome in ("failed", "passed") and any(matches(case.nodeid, p) for p in prefixes):
            case = replace(case, outcome="xfailed" if case.outcome == "failed" else "failed")
        out.append(case)
    return out


def load_result(
    engine: str,
    junit: Path,
    report: Path | None = None,
    version: str | None = None,
    xfails: Path | None = None,
) -> EngineResult:
    """One engine's results; ``version`` overrides the report's (or stands in for a missing report)."""
    cases = read_junit(junit)
    recorded, dtype, tolerances = (None, "float32", []) if report is None else read_report(report)
    result = EngineResult(
        engine, version or recorded or "version not recorded", cases, dtype, tolerances, run=read_run(junit)
    )
    if xfails is not None:
        from infer_ref.conformance.xfail_files import read_xfails

        if not xfails.is_file():
            raise UsageError(f"--xfails {engine}={xfails}: no such file")
        result.cases = apply_xfails(cases, read_xfails(xfails, dtype=dtype))
        result.remarks.append(
            f"run without an xfails file; failures listed in `{xfails.name}` counted as expected"
        )
    return result
