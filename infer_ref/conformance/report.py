"""The conformance report: per capability and per bug class, what passed, failed, was expected to
fail or is not supported, with the first failure's repro line.

The pytest plugin registers a :class:`Collector` in the process that sees every test report (the
xdist controller, or the only process). Each test carries, in its ``user_properties``, the
capabilities it needs (``ir_requires``), the bug classes its docstring guards (``Guards: *...*``),
its xfail entry and how many draws the adapter refused as :class:`~infer_ref.conformance.interface.contract.Unsupported`.
The report is printed at the end of the run; ``--ir-report FILE.md`` or ``FILE.json`` writes it.
Stale xfail entries (matching no test that ran) fail the run here.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest

from infer_ref.conformance import blame, tiers
from infer_ref.conformance.blame.probes import ProbeResult, Runner
from infer_ref.conformance.blame.suite import run_probes
from infer_ref.conformance.checkpoints.snapshots import FAMILIES
from infer_ref.conformance.rerun import pyargs_command
from infer_ref.conformance.xfail_files import matches
from infer_ref.errors import EXIT_NOT_JUDGED  # neither conforms (0) nor does not (1): docs/errors.md

OUTCOMES = ("passed", "failed", "xfailed", "not supported", "not judged", "skipped")

# A test whose engine could not be started or reached skips with a reason that starts with this:
# nothing about the engine was learnt, so it is neither passed nor failed.
NOT_JUDGED = "not judged:"
NOTHING_JUDGED, PARTLY_JUDGED = "nothing judged", "not everything judged"
# The verdict's kind (the JSON report's ``verdict_kind``): what the run showed, beside its tolerance
# tier (``verdict``). A pass with tests not supported conforms only on what it supports, and says so.
CONFORMS, CONFORMS_ON_SUPPORTED, DOES_NOT_CONFORM = "conforms", "conforms on what it supports", "does not conform"


def bug_classes_of(item: pytest.Item, known: Sequence[str]) -> list[str]:
    """The bug classes among ``known`` that a test's docstring names as ``*class*``."""
    doc = getattr(getattr(item, "function", None), "__doc__", None) or ""
    named = {" ".join(m.split()) for m in re.findall(r"\*([^*]+)\*", doc)}
    return [c for c in known if c in named]


@dataclass
class Tally:
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    first_failure: str | None = None
    unsupported_draws: int = 0

    def add(self, outcome: str, repro: str | None, unsupported: int) -> None:
        self.counts[outcome] += 1
        self.unsupported_draws += unsupported
        if outcome == "failed" and self.first_failure is None:
            self.first_failure = repro


@dataclass(frozen=True)
class Observed:
    """One judged test as the report saw it (the engine tier's blame reads these): its node id, its
    outcome, the bug classes it guards, the capabilities it needs, its checkpoint folder (engine
    tier), and its text: a failure's message or a skip's reason."""

    nodeid: str
    outcome: str
    bug_classes: tuple[str, ...]
    capabilities: tuple[str, ...]
    family: str | None
    text: str
    refusal: bool = False  # failed because the implementation raised (no wrong value to blame)


@dataclass
class Report:
    impl: str
    adapter: str
    version: str
    device: str
    dtype: str
    capabilities: dict[str, str | None]
    by_capability: dict[str, Tally] = field(default_factory=OrderedDict)
    by_bug_class: dict[str, Tally] = field(default_factory=OrderedDict)
    by_oracle: dict[str, Tally] = field(default_factory=OrderedDict)
    by_family: dict[str, Tally] = field(default_factory=OrderedDict)  # engine tier: per checkpoint folder
    totals: Tally = field(default_factory=Tally)
    stale_xfails: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    verdict: str = ""  # float64: one of infer_ref.conformance.tiers.VERDICTS; other dtypes: passed / wrong
    precision_tests: int = 0  # tests whose float64 logits reached only the float32-intermediates tier
    precision_notes: list[str] = field(default_factory=list)  # the first few of them
    refusals: list[str] = field(default_factory=list)  # failed tests where the implementation raised: "node id: Type: message"
    blame: dict[str, dict[str, str]] = field(default_factory=OrderedDict)  # candidate class -> {"verdict", "why"} (infer_ref.conformance.blame)
    probes: list[str] = field(default_factory=list)  # the follow-up probes that ran, with their outcomes
    # What the verdict's tolerances did not cover and an xfails file let pass: beside the verdict, so
    # a run with expected failures never reads as clean. beyond_tolerance: a tier's largest distances
    # past its tolerance (the engine tier fills it); expected_failures: their count with those.
    beyond_tolerance: list[str] = field(default_factory=list)
    expected_failures: str = ""
    not_judged: str = ""  # the first reason a test was not judged (its engine did not start or answer)
    not_judged_reasons: list[str] = field(default_factory=list)  # every distinct reason (each folder whose engine did not start)
    # bfloat16/float16 engine tier: per agreement test and checkpoint, the distribution summary
    # (infer_ref.conformance.engines.verdicts.distribution.Summary fields), its thresholds and what exceeded them
    distributions: list[dict] = field(default_factory=list)
    verdict_kind: str = ""  # CONFORMS, CONFORMS_ON_SUPPORTED, DOES_NOT_CONFORM, NOTHING_JUDGED or PARTLY_JUDGED
    # why tests were not supported, grouped: the capabilities (or the implementation's reason) -> tests
    not_supported_reasons: dict[str, int] = field(default_factory=dict)
    # engine tier (infer_ref.conformance.engines.blame): the bug class the outcomes point to and why,
    # the classes the engine cannot exhibit (class -> the capabilities it lacks), one line per failed
    # test (what differed) and the one command that reruns the most telling failure
    most_likely: str = ""
    most_likely_why: str = ""
    cannot_exhibit: dict[str, str] = field(default_factory=OrderedDict)
    failures: list[str] = field(default_factory=list)
    repro: str = ""
    repro_script: str = ""  # the standalone script the same failure wrote, where it wrote one

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    def to_markdown(self) -> str:
        lines = [
            f"# Conformance report: {self.adapter} {self.version}".rstrip(),
            "",
            f"implementation `{self.impl}`, device `{self.device}`, dtype `{self.dtype}`",
            "",
            f"totals: {_counts(self.totals)}",
            "",
            verdict_line(self),
            "",
            *_table("capability", self.by_capability, self.capabilities),
            "",
            *_table("bug class", self.by_bug_class, None),
            "",
            *_table("oracle", self.by_oracle, None),
        ]
        if self.by_family:
            lines += ["", *_table("checkpoint", self.by_family, None)]
        if self.stale_xfails:
            lines += ["", "stale xfail entries (they fail the run): " + ", ".join(f"`{s}`" for s in self.stale_xfails)]
        if self.most_likely or self.cannot_exhibit:
            lines += ["", *self.engine_blame_lines()]
        if self.blame and not self.most_likely:
            lines += ["", "blame (the bug classes of the failed tests, narrowed by follow-up probes; one bug assumed):",
                      *(f"- **{b['verdict']}**: {name} ({b['why']})" for name, b in self.blame.items())]
        if self.probes:
            lines += ["", "follow-up probes (float64, on each failing family's probe checkpoint):", *(f"- {p}" for p in self.probes)]
        if self.refusals:
            lines += ["", "refusals (the implementation raised instead of answering; counted as failures, blamed on no bug class):",
                      *(f"- `{r}`" for r in self.refusals)]
        if self.distributions:
            lines += ["", *_distribution_table(self.distributions)]
        if self.precision_notes:
            lines += ["", "precision notes (not failures; `--strict-float64` fails them):", *(f"- {n}" for n in self.precision_notes)]
        if len(self.not_judged_reasons) > 1:
            lines += ["", "not judged, every reason:", *(f"- {r}" for r in self.not_judged_reasons)]
        if self.notes:
            lines += ["", "notes:", *(f"- {n}" for n in self.notes)]
        return "\n".join(lines) + "\n"

    def engine_blame_lines(self) -> list[str]:
        """The engine tier's blame: the most likely class and why, the failures one line each, the
        repro, the other candidates, the classes the engine cannot exhibit."""
        lines = []
        if self.most_likely:
            lines += [f"most likely bug class: **{self.most_likely}** ({self.most_likely_why})"]
        lines += [f"- {f}" for f in self.failures]
        if self.repro:
            lines += [f"repro: `{self.repro}`" + (f" (standalone: `{self.repro_script}`)" if self.repro_script else "")]
        others = [(name, b) for name, b in self.blame.items() if name != self.most_likely]
        if others:
            lines += ["other candidates (one bug assumed):", *(f"- {b['verdict']}: {name} ({b['why']})" for name, b in others)]
        if self.cannot_exhibit:
            lines += ["cannot exhibit (the engine lacks what the class needs; not judged): "
                      + "; ".join(f"{name} (lacks {why})" for name, why in self.cannot_exhibit.items())]
        return lines


def verdict_line(report: Report) -> str:
    """The report's headline: the verdict, what it covers (passed of all tests) and what was not
    judged: tests not supported, grouped by why and counted, and tests whose engine never answered."""
    counts, total = report.totals.counts, sum(report.totals.counts.values())
    kind = report.verdict_kind or verdict_kind_of(report)
    if kind in (CONFORMS, CONFORMS_ON_SUPPORTED):
        line = f"verdict: **{kind}: {counts['passed']} of {total} tests passed** ({report.verdict})"
    elif kind == DOES_NOT_CONFORM:
        line = f"verdict: **{report.verdict}**: {counts['failed']} of {total} tests failed"
    else:
        line = f"verdict: **{report.verdict}**"
    if report.precision_tests:
        line += f" ({report.precision_tests} tests beyond the exact tier, within float32 intermediates)"
    if report.expected_failures:
        line += f"; **{report.expected_failures}**"
    if report.not_judged:
        line += f"; {counts['not judged']} tests not judged: {report.not_judged}"
    if report.not_supported_reasons:
        line += "; not supported: " + not_supported_summary(report.not_supported_reasons)
    if counts["skipped"]:
        line += f"; {counts['skipped']} skipped (their reasons are in pytest's summary)"
    return line


SUMMARY_GROUPS = 6  # the verdict line's not-supported groups; the report's JSON keeps every one


def not_supported_summary(reasons: dict[str, int]) -> str:
    """``reason -> tests`` as ``12 (batch), 3 (prefix_caching)``, the largest groups first, the
    first :data:`SUMMARY_GROUPS` of them (a verdict line, not a list: the rest are counted)."""
    ranked = sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))
    text = ", ".join(f"{n} ({why})" for why, n in ranked[:SUMMARY_GROUPS])
    if len(ranked) > SUMMARY_GROUPS:
        rest = sum(n for _, n in ranked[SUMMARY_GROUPS:])
        text += f", {rest} more in {len(ranked) - SUMMARY_GROUPS} other groups (the report's not_supported_reasons)"
    return text


# "not supported by NAME (cap, cap)", "not supported by NAME (cap: why; ...)", "unsupported by NAME: why",
# "unsupported by NAME for every draw: why": the part after the name is the group.
_NOT_SUPPORTED = re.compile(r"^(?:not supported|unsupported) by .*?(?: for every draw)?(?:: | \()(?P<why>.*?)\)?$", re.DOTALL)


# What differs between checkpoints and workloads in one reason: the checkpoint folder's path and
# how many requests it concerned ("none of the 10 requests ... of /cache/ckpt-a's tokens").
_FOLDER = re.compile(r"(?<![\w.])/[^\s']+")
_REQUEST_COUNT = re.compile(r"\b(of the|of) \d+ (requests?)\b")


def not_supported_reason(skip: str) -> str:
    """What a "not supported" skip says is missing, without the implementation's name, the checkpoint
    folder or the number of requests it concerned (grouping key: one cause, one group)."""
    found = _NOT_SUPPORTED.match(skip.strip())
    why = " ".join((found.group("why") if found else skip).split())
    return _REQUEST_COUNT.sub(r"\1 the \2", _FOLDER.sub("a checkpoint", why)).replace("of the the ", "of the ")


def _counts(t: Tally) -> str:
    text = ", ".join(f"{n} {k}" for k, n in t.counts.items() if n)
    if t.unsupported_draws:
        text += f" ({t.unsupported_draws} draws refused as unsupported)"
    return text or "nothing ran"


def _distribution_table(rows: list[dict]) -> list[str]:
    """The low-precision verdict's summaries, llama.cpp-style (docs/low-precision.md)."""
    out = ["distribution against the oracle (KL in nats over the returned tokens + the rest; thresholds in docs/low-precision.md; "
           "temperature slope and chosen token's signed error ± standard error, reported, not judged):", "",
           "| test | checkpoint | positions | KL mean | KL median | KL p99 | KL max | logprob error max | same top | slope | signed error | past its threshold |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        out.append(f"| {r['test']} | {r['checkpoint']} | {r['positions']} | {r['kl_mean']:.2e} | {r['kl_median']:.2e} | {r['kl_p99']:.2e} | "
                   f"{r['kl_max']:.2e} | {r['logprob_error_max']:.3f} | {r['same_top'] * 100:.1f}% | {_with_se(r, 'slope')} | "
                   f"{_with_se(r, 'chosen_error')} | {', '.join(r['exceeded']) or 'none'} |")  # fmt: skip
    return out


def _with_se(row: dict, name: str) -> str:
    """``value ± SE`` of a signed statistic of a distribution row ("" where it was not computed)."""
    value, se = row.get(name), row.get(f"{name}_se")
    return "" if value is None or se is None else f"{value:+.2e} ± {se:.1e}"


def _table(title: str, rows: dict[str, Tally], why_not: dict[str, str | None] | None) -> list[str]:
    # "not judged" gets its column only in a run that has such tests (the usual report keeps its shape).
    judged_all = not any(t.counts["not judged"] for t in rows.values())
    extra = "" if judged_all else " not judged |"
    out = [f"| {title} | passed | failed | xfailed | not supported |{extra} first failure |",
           "|---" * (6 if judged_all else 7) + "|"]
    for name, t in rows.items():
        c = t.counts
        unsupported = str(c["not supported"])
        if why_not and why_not.get(name):
            unsupported += f" ({why_not[name]})"
        elif t.unsupported_draws:
            unsupported += f" (+{t.unsupported_draws} draws)"
        first = f"`{t.first_failure}`" if t.first_failure else ""
        not_judged = "" if judged_all else f" {c['not judged']} |"
        out.append(f"| {name} | {c['passed']} | {c['failed']} | {c['xfailed']} | {unsupported} |{not_judged} {first} |")
    return out


def verdict_of(report: Report) -> str:
    """float64: exact / float32 intermediates / wrong (``infer_ref.conformance.tiers``); other dtypes:
    within the dtype's tolerances / wrong. A failed test (not an expected one) makes it wrong; with
    none, a test not judged (its engine never started) makes it "nothing judged" or, where other
    tests passed, "not everything judged"; so does a run in which no test passed (every one not
    supported, skipped or an expected failure): nothing was shown to conform."""
    if report.totals.counts["failed"]:
        return tiers.WRONG
    if report.totals.counts["not judged"]:  # never "conforms" for what was not looked at
        return PARTLY_JUDGED if report.totals.counts["passed"] else NOTHING_JUDGED
    if not report.totals.counts["passed"]:  # every test not supported, skipped or expected to fail
        return NOTHING_JUDGED
    if report.dtype != "float64" or report.adapter.startswith("engine tier"):  # the engine tier has its own tolerances
        return f"within the {report.dtype} tolerances"
    return tiers.FLOAT32_STEPS if report.precision_tests else tiers.EXACT


def verdict_kind_of(report: Report) -> str:
    """What the verdict claims: a failure does not conform; a run with no failure conforms, on what
    it supports where some tests were not supported; what was not judged never reads as either."""
    verdict = report.verdict or verdict_of(report)
    if verdict == tiers.WRONG:
        return DOES_NOT_CONFORM
    if verdict in (NOTHING_JUDGED, PARTLY_JUDGED):
        return verdict
    return CONFORMS_ON_SUPPORTED if report.totals.counts["not supported"] else CONFORMS


def expected_failures_of(report: Report) -> str:
    """The expected failures beside the verdict: how many, and what of them passed the tolerances
    only because an xfails file listed them ("" when there are none)."""
    count = report.totals.counts["xfailed"]
    if not count:
        return ""
    text = f"{count} expected failure{'s' if count > 1 else ''} (listed in the xfails file)"
    return text + "".join(f"; beyond the tolerance: {b}" for b in report.beyond_tolerance)


def outcome_of(report: pytest.TestReport) -> str | None:
    """The test's outcome from the report of the phase that decides it (None: not that phase)."""
    if report.when == "call" or (report.when == "setup" and not report.passed):
        if hasattr(report, "wasxfail"):
            # Skipped: it failed as expected. Passed: an entry marked [may pass] that passed here (a
            # strict entry's XPASS is reported failed, without wasxfail, and counted below).
            return "xfailed" if report.skipped else ("passed" if report.passed else "failed")
        if report.skipped:
            reason = skip_reason(report)
            if reason.startswith(NOT_JUDGED):
                return "not judged"
            return "not supported" if ("not supported by" in reason or "unsupported by" in reason) else "skipped"
        return "passed" if report.passed else "failed"
    if report.when == "teardown" and report.failed:
        return "failed"
    return None


def skip_reason(report: pytest.TestReport) -> str:
    """A skipped test's reason, without pytest's ``Skipped: `` prefix."""
    reason = str(report.longrepr[2]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
    return reason.removeprefix("Skipped: ")


def repro_of(report: pytest.TestReport, impl: str) -> str:
    text = str(report.longrepr) if report.longrepr is not None else ""
    # a message's lines as pytest prints them: "E   repro: ..." (an AssertionError's), or bare (pytest.fail's)
    found = re.findall(r"^(?:E\s+)?\s*repro: (.+)$", text, flags=re.MULTILINE)
    selects = impl if impl.startswith("--ir-") else f"--ir-impl={impl}"  # the engine tier names its engine itself
    return found[-1] if found else pyargs_command(report.nodeid, selects)


def observed(report: pytest.TestReport, outcome: str, props: dict[str, Any]) -> Observed:
    """What the engine tier's blame reads of one test: a failure's message (``ir_failure``, recorded
    by the tier's conftest; else pytest's text of it) or a skip's reason."""
    if outcome == "failed":
        text = str(props.get("ir_failure") or report.longrepr or "")
    else:
        text = skip_reason(report) if report.skipped else ""
    return Observed(
        nodeid=report.nodeid,
        outcome=outcome,
        bug_classes=tuple(props.get("ir_bug_classes", ())),
        capabilities=tuple(props.get("ir_capabilities", ())),
        family=str(props["ir_family"]) if "ir_family" in props else None,
        text=text[:4000],
        refusal="ir_refusal" in props,
    )


class Collector:
    """Tallies test reports into a :class:`Report` (registered by the plugin as a pytest plugin)."""

    def __init__(self, config: pytest.Config, impl: str, adapter: Any, capabilities: dict[str, str | None], xfails: list[str] | None) -> None:
        self.config = config
        self.xfails = list(xfails or [])
        self.used_xfails: set[str] = set()
        # Entries whose tests -k/-m left out: not run here, so neither used nor stale.
        self.deselected_xfails: set[str] = set()
        self.after_loss = 0  # failures in a process whose CUDA context an earlier test lost
        self.adapter = adapter
        self.failed_guards: dict[str, list[str]] = {}  # failed test (not a refusal) -> the bug classes it guards
        self.passed_guards: dict[str, list[str]] = {}  # passed test -> the bug classes it guards
        # The engine tier's blame and terminal summary (set by the plugin: this layer knows no engine)
        self.observed: list[Observed] = []
        self.engine_blame: Callable[[Report, Sequence[Observed]], None] | None = None
        self.terminal_lines: Callable[[Report], list[str]] | None = None
        self.report = Report(
            impl=impl,
            adapter=adapter.name,
            version=adapter.version,
            device=str(config.getoption("--ir-device")),
            dtype=str(config.getoption("--ir-dtype")),
            capabilities=capabilities,
        )

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        for item in items:
            self.deselected_xfails.update(e for e in self.xfails if matches(item.nodeid, e))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        props: dict[str, Any] = dict(report.user_properties)
        if "ir_capabilities" not in props:
            return  # not a conformance test
        if "ir_xfail" in props:
            self.used_xfails.add(str(props["ir_xfail"]))
        outcome = outcome_of(report)
        if outcome is None:
            return
        repro = repro_of(report, self.report.impl) if outcome == "failed" else None
        unsupported = int(props.get("ir_unsupported", [0])[0])
        if outcome == "failed" and "ir_cuda_lost" in props:
            self._note(f"{report.nodeid} hit a CUDA device-side assert: the process's CUDA context is lost after it")
        if outcome == "failed" and "ir_after_cuda_loss" in props:
            self.after_loss += 1
        for text in props.get("ir_notes", []):
            self._note(text)
        if "ir_precision" in props and outcome == "passed":
            self.report.precision_tests += 1
            if len(self.report.precision_notes) < 10:
                self.report.precision_notes.append(f"{report.nodeid}: {props['ir_precision']}")
        if outcome == "not judged":
            reason = skip_reason(report).removeprefix(NOT_JUDGED).strip()
            self.report.not_judged = self.report.not_judged or reason
            if reason not in self.report.not_judged_reasons and len(self.report.not_judged_reasons) < 50:
                self.report.not_judged_reasons.append(reason)
        if outcome == "not supported":
            why = not_supported_reason(skip_reason(report))
            reasons = self.report.not_supported_reasons
            if why in reasons or len(reasons) < 50:
                reasons[why] = reasons.get(why, 0) + 1
        self.report.totals.add(outcome, repro, unsupported)
        if self.engine_blame is not None:
            self.observed.append(observed(report, outcome, props))
        for cap in props["ir_capabilities"] or ["(no capability)"]:
            self.report.by_capability.setdefault(cap, Tally()).add(outcome, repro, unsupported)
        if "ir_oracle" in props:
            self.report.by_oracle.setdefault(str(props["ir_oracle"]), Tally()).add(outcome, repro, unsupported)
        if "ir_family" in props:
            self.report.by_family.setdefault(str(props["ir_family"]), Tally()).add(outcome, repro, unsupported)
        if outcome == "failed" and "ir_refusal" in props:
            if len(self.report.refusals) < 50:
                self.report.refusals.append(f"{report.nodeid}: {props['ir_refusal']}")
            return  # a refusal says nothing about which bug class the implementation has
        if outcome in ("failed", "passed"):
            (self.failed_guards if outcome == "failed" else self.passed_guards)[report.nodeid] = list(props.get("ir_bug_classes", []))
        for bug in props.get("ir_bug_classes", []):
            self.report.by_bug_class.setdefault(bug, Tally()).add(outcome, repro, unsupported)

    def _note(self, text: str) -> None:
        if text not in self.report.notes and len(self.report.notes) < 50:
            self.report.notes.append(text)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.report.totals == Tally():
            return
        if self.after_loss:
            self._note(f"{self.after_loss} failure(s) came after a CUDA device-side assert in the same process: rerun them alone before reading them as findings")
        ran_or_left_out = self.used_xfails | self.deselected_xfails
        self.report.stale_xfails = [e for e in self.xfails if e not in ran_or_left_out]
        self.report.verdict = verdict_of(self.report)
        self.report.verdict_kind = verdict_kind_of(self.report)
        self.report.expected_failures = expected_failures_of(self.report)
        self._blame()
        if self.report.stale_xfails and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if self.report.verdict in (NOTHING_JUDGED, PARTLY_JUDGED) and session.exitstatus == 0:
            session.exitstatus = EXIT_NOT_JUDGED
        path = self.config.getoption("--ir-report")
        if path:
            target = Path(path)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(self.report.to_json() if target.suffix == ".json" else self.report.to_markdown())

    def _blame(self) -> None:
        """Narrow the failed tests' bug classes (:mod:`infer_ref.conformance.blame`); model-level
        candidates get the follow-up probes first (the engine tier has its own classes)."""
        failed = {node: guards for node, guards in self.failed_guards.items() if guards}
        if self.engine_blame is not None:
            self.engine_blame(self.report, self.observed)
            return
        if not failed or self.report.adapter.startswith("engine tier"):
            return
        results: list[ProbeResult] = []
        if blame.needs_probes(c for g in failed.values() for c in g):
            try:
                runner = Runner(self.adapter, self.report.device)
            except ValueError as exc:
                self._note(f"no follow-up probes: {exc}")
            else:
                for family in blame.probe_families(failed, FAMILIES):
                    results += run_probes(runner, family)
        findings, note = blame.narrow(failed, results, self.passed_guards)
        self.report.blame = OrderedDict((c, {"verdict": f.verdict, "why": f.why}) for c, f in findings.items())
        self.report.probes = [r.describe() for r in results]
        if note:
            self._note(note)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.report.totals == Tally():
            return
        terminalreporter.section("infer_ref conformance report")
        lines = self.terminal_lines(self.report) if self.terminal_lines else self.report.to_markdown().splitlines()
        for line in lines:
            terminalreporter.write_line(line)
