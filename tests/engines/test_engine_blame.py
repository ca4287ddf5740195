"""The engine tier's blame (infer_ref.conformance.engines.blame) and its failures in a line each
(infer_ref.conformance.engines.failures), on outcomes written here: no engine runs. The planted bugs'
own runs assert the named class in the slow tier (tests/engines/test_planted_engine_bugs.py)."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

import infer_ref.conformance.engines.tests as tier_tests
from infer_ref.conformance.engines import blame
from infer_ref.conformance.engines.blame import (
    AS_LIKELY,
    NEVER,
    PROFILES,
    Judged,
    blame_report,
    engine_capabilities,
    judged_tests,
    narrow,
)
from infer_ref.conformance.engines.failures import failure_lines, repro_command, terminal_lines, what_differed
from infer_ref.conformance.engines.mutants import ENGINE_BUG_CLASSES, LONG_CONTEXT_BUG_CLASSES
from infer_ref.conformance.engines.protocol import CAPABILITIES
from infer_ref.conformance.report import Observed, Report, Tally
from infer_ref.conformance.rerun import pyargs_command

EVERY = frozenset(CAPABILITIES)
STALE = "preemption resumes from a stale position"
SELECTS = "--ir-engine=my.engine:start --ir-model-dir=/data/llama-tiny"


def _tier_tests() -> dict[str, str]:
    """The tier's test functions -> their docstrings, read from the source (importing the tier's
    test modules outside a tier run would register none of their markers)."""
    folder = Path(tier_tests.__file__).parent
    found = {}
    for path in folder.glob("test_*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                found[node.name] = ast.get_docstring(node) or ""
    return found


def _guarded_classes() -> set[str]:
    """Every ``*class*`` a tier test's docstring says it guards."""
    return {" ".join(m.split()) for doc in _tier_tests().values() for m in re.findall(r"\*([^*]+)\*", doc)}


def test_every_profile_names_tests_that_exist() -> None:
    """A renamed test would leave a profile pointing at nothing (its class then never named)."""
    names = set(_tier_tests())
    named = {test for p in PROFILES.values() for test in p.fails}
    assert named <= names, sorted(named - names)


def test_every_planted_and_guarded_class_has_a_profile() -> None:
    assert set(ENGINE_BUG_CLASSES + LONG_CONTEXT_BUG_CLASSES) <= set(PROFILES)
    assert _guarded_classes() <= set(PROFILES), sorted(_guarded_classes() - set(PROFILES))


def _judged(failed: set[str], passed: set[str], family: str = "llama-tiny") -> list[Judged]:
    return [Judged(t, family, True) for t in sorted(failed)] + [
        Judged(t, family, False) for t in sorted(passed)
    ]


# The default workload's tests (what a run on one checkpoint judges on an engine that declares everything).
DEFAULT = {t for p in PROFILES.values() for t in p.fails if "long" not in t and "recipe" not in t}


def _only(*failed: str) -> list[Judged]:
    return _judged(set(failed), DEFAULT - set(failed))


def test_the_test_built_for_a_class_failing_alone_names_it() -> None:
    assert narrow(_only(blame.STOP), EVERY).most_likely == "stop string cut at the last occurrence"
    assert narrow(_only(blame.MAX_TOKENS), EVERY).most_likely == "max_tokens off by one"
    assert narrow(_only(blame.TOP_K), EVERY).most_likely == "top-k list unsorted or missing the chosen token"


def test_a_failed_test_the_class_never_fails_moves_the_blame() -> None:
    """The top-k test alone: the top-k lists. With the oracle tests failing too: a shift, which fails
    both (a bug of the top-k lists never changes a logprob the oracle judges)."""
    found = narrow(_only(blame.TOP_K, blame.GENERATED, blame.PROMPT, blame.CONVERSATION), EVERY)
    assert found.most_likely == "logprobs shifted by one position", found
    why = found.others["top-k list unsorted or missing the chosen token"][1]
    oracle_tests = [t.removeprefix("test_") for t in (blame.GENERATED, blame.PROMPT, blame.CONVERSATION)]
    assert any(why == f"`{t}` failed, which its bugs never fail" for t in oracle_tests), why


def test_preemption_is_named_where_only_the_preempting_tests_fail_and_the_chunked_test_passes() -> None:
    found = narrow(_only(blame.GENERATED, blame.SEED_PREEMPTED, blame.WARM, blame.PERMUTED), EVERY)
    assert found.most_likely == STALE, found
    assert "only after a preemption" in found.why and "chunked_prefill_matches_whole" in found.why, found.why


def test_a_class_the_engine_cannot_exhibit_is_never_named_and_says_what_it_lacks() -> None:
    without_budget = EVERY - {"kv_budget"}
    found = narrow(_only(blame.GENERATED, blame.SEED_PREEMPTED), without_budget)
    assert found.most_likely != STALE and STALE not in found.others
    assert found.cannot_exhibit[STALE] == "kv_budget"


def test_classes_the_tests_do_not_separate_are_as_likely() -> None:
    chunks = ("prompt chunk positions restart at 0", "prompt chunk K/V not written")
    found = narrow(_only(blame.CHUNKED, blame.GENERATED, blame.BATCH), EVERY)
    assert found.most_likely in chunks, found
    other = next(c for c in chunks if c != found.most_likely)
    assert found.others[other][0] == AS_LIKELY and "not separated" in found.why


def test_a_window_class_is_never_named_on_a_checkpoint_without_windows() -> None:
    window = PROFILES["prompt chunk sees the cache past its sliding window"]
    assert window.chance(blame.CHUNKED, "llama-tiny") == NEVER == window.chance(blame.CHUNKED, "qwen3-tiny")
    # a family with windows, and a folder whose name says nothing: not excluded
    assert (
        window.chance(blame.CHUNKED, "gemma3-tiny") > NEVER
        and window.chance(blame.CHUNKED, "my-model") > NEVER
    )


def test_nothing_failed_names_nothing() -> None:
    found = narrow(_judged(set(), DEFAULT), EVERY)
    assert found.most_likely == "" and found.others == {}


def _observed(
    nodeid: str, outcome: str, text: str = "", *, family: str = "llama-tiny", refusal: bool = False
) -> Observed:
    return Observed(nodeid, outcome, (), (), family, text, refusal)


def test_a_tests_cases_on_one_checkpoint_are_one_piece_of_evidence_and_refusals_none() -> None:
    observed = [
        _observed("test_stopping.py::test_max_tokens_exact[llama-tiny-1]", "passed"),
        _observed("test_stopping.py::test_max_tokens_exact[llama-tiny-2]", "failed"),
        _observed("test_stopping.py::test_max_tokens_exact[qwen3-tiny-1]", "passed", family="qwen3-tiny"),
        _observed(
            "test_agreement.py::test_generated_logprobs_agree_with_oracle[llama-tiny]", "failed", refusal=True
        ),
        _observed("test_stopping.py::test_stop_string_cut_at_earliest[llama-tiny]", "not supported"),
    ]
    assert judged_tests(observed) == [
        Judged(blame.MAX_TOKENS, "llama-tiny", True),
        Judged(blame.MAX_TOKENS, "qwen3-tiny", False),
    ]


def test_capabilities_from_the_tests_when_the_engine_declared_none() -> None:
    report = Report("--ir-engine=x", "engine tier:", "x", "the engine's", "float32", {})
    observed = [
        Observed("a.py::test_a[f]", "passed", (), ("batch",), "f", ""),
        Observed(
            "a.py::test_b[f]",
            "not supported",
            (),
            ("batch", "kv_budget"),
            "f",
            "not supported by x (kv_budget)",
        ),
    ]
    assert engine_capabilities(report, observed) == frozenset({"batch"})
    declared = Report(
        "--ir-engine=x",
        "engine tier:",
        "x",
        "the engine's",
        "float32",
        {"batch": None, "seed": "not declared"},
    )
    assert engine_capabilities(declared, observed) == frozenset({"batch"})


VERDICT = """1 of 17 requests disagree with the oracle (tolerance 0.0002):
request 15 (38 prompt tokens, tolerance 0.0002): step 3: logprob of token 220: engine -0.000320, oracle -10.665799 (|diff| 10.7); step 3: logprob of token 11: engine -10.451405, oracle -10.770341 (|diff| 0.319)
repro: pytest --pyargs infer_ref.conformance.engines.tests -p no:xdist -k 'test_generated_logprobs_agree_with_oracle' --ir-engine=my.engine:start --ir-model-dir=/data/llama-tiny
repro: python /tmp/engine-repros/test_generated_logprobs_agree_with_oracle-llama-tiny.py"""


def test_a_failure_in_one_line_says_what_differed() -> None:
    assert what_differed(VERDICT) == (
        "1 of 17 requests disagree with the oracle (tolerance 0.0002): request 15 (38 prompt tokens, tolerance "
        "0.0002): step 3: logprob of token 220: engine -0.000320, oracle -10.665799 (|diff| 10.7)"
    )
    lines = failure_lines([_observed(f"t.py::test_{i}[llama-tiny]", "failed", VERDICT) for i in range(10)])
    assert len(lines) == 9 and lines[-1].startswith("… and 2 more failed tests"), lines


def test_the_repro_is_the_verdicts_pyargs_command_or_one_made_from_the_test_id() -> None:
    failure = _observed(
        "test_agreement.py::test_generated_logprobs_agree_with_oracle[llama-tiny]", "failed", VERDICT
    )
    assert repro_command(failure, SELECTS) == VERDICT.splitlines()[2].removeprefix("repro: ")
    plain = _observed(
        "infer_ref/conformance/engines/tests/test_determinism.py::test_seeded_request_repeats[llama-tiny]",
        "failed",
        "x",
    )
    assert repro_command(plain, SELECTS) == (
        "pytest --pyargs infer_ref.conformance.engines.tests.test_determinism -p no:xdist "
        f"-k 'test_seeded_request_repeats[llama-tiny]' {SELECTS}"
    )


def test_an_adapter_tests_command_names_its_module_by_package() -> None:
    assert pyargs_command(
        "infer_ref/conformance/tests/test_cache.py::test_reset[dynamic]", "--ir-impl=a:B"
    ) == (
        "pytest --pyargs infer_ref.conformance.tests.test_cache -p no:xdist -k 'test_reset[dynamic]' --ir-impl=a:B"
    )


def _report_with(observed: list[Observed], capabilities: dict[str, str | None]) -> Report:
    report = Report(SELECTS, "engine tier:", "my.engine:start", "the engine's", "float32", capabilities)
    report.by_bug_class[STALE] = Tally()
    report.by_bug_class[STALE].add("passed", None, 0)
    for o in observed:
        report.totals.add(o.outcome, None, 0)
    report.verdict = (
        "wrong" if any(o.outcome == "failed" for o in observed) else "within the float32 tolerances"
    )
    blame_report(report, observed)
    return report


def test_a_class_the_engine_cannot_exhibit_leaves_the_table_and_is_never_passed() -> None:
    """transformers' generate has no KV budget: preemption cannot happen, so "passed" would be a lie."""
    caps: dict[str, str | None] = {c: None if c != "kv_budget" else "not declared" for c in CAPABILITIES}
    report = _report_with(
        [_observed("test_agreement.py::test_generated_logprobs_agree_with_oracle[llama-tiny]", "passed")],
        caps,
    )
    text = report.to_markdown()
    assert f"| {STALE} |" not in text, text
    assert f"{STALE} (lacks kv_budget)" in text and report.most_likely == ""


def test_the_terminal_report_names_the_class_each_failure_and_one_repro() -> None:
    # what the preemption_stale_position planted bug fails on one checkpoint
    also_failed = {blame.PROMPT, blame.CONVERSATION, blame.PERMUTED, blame.WARM}
    observed = [
        _observed(
            "test_agreement.py::test_generated_logprobs_agree_with_oracle[llama-tiny]", "failed", VERDICT
        ),
        _observed(
            "test_determinism.py::test_seeded_requests_same_under_preemption_and_arrival_order[llama-tiny]",
            "failed",
            "request 8 (arrival order, preempting budget): (1, 2), alone: (1, 3)\nassert '(1, 2)' is None",
        ),
        *(_observed(f"x.py::{t}[llama-tiny]", "failed", "differs") for t in sorted(also_failed)),
        *(
            _observed(f"x.py::{t}[llama-tiny]", "passed")
            for t in sorted(DEFAULT - {blame.GENERATED, blame.SEED_PREEMPTED} - also_failed)
        ),
    ]
    lines = terminal_lines(_report_with(observed, dict.fromkeys(CAPABILITIES)))
    assert any(line.startswith(f"most likely bug class: {STALE} (") for line in lines), lines
    repro = [line for line in lines if line.startswith("repro: ")]
    assert repro == [
        "repro: pytest --pyargs infer_ref.conformance.engines.tests.test_determinism -p no:xdist "
        f"-k 'test_seeded_requests_same_under_preemption_and_arrival_order[llama-tiny]' {SELECTS}"
    ], lines
    seeded = "- `test_seeded_requests_same_under_preemption_and_arrival_order[llama-tiny]`: request 8 (arrival order, "
    assert seeded + "preempting budget): (1, 2), alone: (1, 3)" in lines, lines


@pytest.mark.parametrize("module", ["blame", "failures"])
def test_the_blame_modules_import_no_engine(module: str) -> None:
    """Plain functions over the report's records: nothing of torch or an engine is imported."""
    source = importlib.import_module(f"infer_ref.conformance.engines.{module}").__file__
    assert source is not None
    tree = ast.parse(Path(source).read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not {m for m in imported if m.startswith(("torch", "infer_ref.engine", "transformers"))}, imported


def test_a_case_id_that_k_cannot_take_reruns_every_case_of_the_test() -> None:
    """pytest's -k takes no spaces or parentheses: such an id gives the function's name (its cases all run)."""
    command = pyargs_command("t/test_cache.py::test_x[a (b)]", "--ir-impl=a:B")
    assert (
        command
        == "pytest --pyargs infer_ref.conformance.tests.test_cache -p no:xdist -k test_x --ir-impl=a:B"
    )


def test_tracebacks_pass_through_to_the_engine_tier_and_are_refused_elsewhere() -> None:
    from infer_ref.cli.conformance import check_engine_args, pytest_args
    from infer_ref.cli.main import build_parser
    from infer_ref.cli.options import UsageError

    parser = build_parser()
    plain = pytest_args(parser.parse_args(["conformance", "--engine", "infer_ref"]), [])
    assert (
        "--ir-tracebacks" not in plain and "-rEsxX" in plain
    )  # failures listed by the report, not FAILED lines
    flagged = pytest_args(parser.parse_args(["conformance", "--engine", "infer_ref", "--tracebacks"]), [])
    assert "--ir-tracebacks" in flagged and "-rfEsxX" in flagged
    with pytest.raises(UsageError, match="--tracebacks belongs to the engine tier"):
        check_engine_args(parser.parse_args(["conformance", "--tracebacks"]))
