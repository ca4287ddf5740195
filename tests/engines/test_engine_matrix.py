"""The engine matrix (``scripts/engine_matrix.py``): cells from hand-written JUnit and report JSON,
family names, the SVG's cells, and run mode leaving out an engine without its venv in one line."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path

import pytest

from infer_ref.conformance.engines.matrix.families import family_of
from infer_ref.conformance.engines.matrix.grid import build_grid
from infer_ref.conformance.engines.matrix.main import main
from infer_ref.conformance.engines.matrix.results import load_result
from infer_ref.conformance.engines.matrix.tier_runs import run_engines, tier_command

PKG = "infer_ref.conformance.engines.tests"


def _case(module: str, name: str, outcome: str) -> str:
    body = {"passed": "", "failed": '<failure message="assert 1 == 2"/>', "xfailed": '<skipped type="pytest.xfail" message="listed"/>',
            "skipped": '<skipped type="pytest.skip" message="not supported by x (prefix_caching)"/>'}[outcome]  # fmt: skip
    return f'<testcase classname="{PKG}.{module}" name="{name}" time="0.1">{body}</testcase>'


ALPHA = [  # the expected cells are stated with each test below
    ("test_agreement", "test_generated_logprobs_agree_with_oracle[llama-tiny]", "passed"),
    ("test_agreement", "test_generated_logprobs_agree_with_oracle[llama3-ropescaling-mha-untied-t4]", "passed"),
    ("test_agreement", "test_generated_logprobs_agree_with_oracle[qwen3-tiny]", "failed"),
    ("test_agreement", "test_generated_logprobs_agree_with_oracle[gemma3-tiny]", "xfailed"),
    ("test_stopping", "test_max_tokens_exact[llama-tiny-1]", "passed"),
    ("test_stopping", "test_max_tokens_exact[llama-tiny-2]", "skipped"),
    ("test_self_consistency", "test_batch_matches_alone[gemma3-tiny]", "passed"),
]
BETA = [("test_agreement", "test_generated_logprobs_agree_with_oracle[qwen3-tiny]", "passed")]
BETA_NOTES = ["engine: beta 1.0 (offline)",
              "largest difference from the oracle: 2e-06 nats (test_x[qwen3-tiny], 4 answers); tolerance 0.001 (the oracle tolerance for float32)",
              "something else"]  # fmt: skip


def _write(folder: Path, engine: str, cases: Sequence[tuple[str, str, str]], notes: list[str] | None = None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    xml = "".join(_case(*c) for c in cases)
    (folder / f"{engine}.xml").write_text(f'<?xml version="1.0"?><testsuites><testsuite name="pytest">{xml}</testsuite></testsuites>')
    if notes is not None:
        (folder / f"{engine}.json").write_text(json.dumps({"dtype": "float32", "notes": notes}))


@pytest.fixture
def results(tmp_path: Path) -> Path:
    _write(tmp_path / "res", "alpha", ALPHA)
    _write(tmp_path / "res", "beta", BETA, BETA_NOTES)
    return tmp_path / "res"


def _draw(results: Path, tmp_path: Path, *extra: str) -> tuple[str, ET.Element]:
    md, svg = tmp_path / "out" / "m.md", tmp_path / "out" / "m.svg"
    assert main(["--results", str(results), "--md", str(md), "--svg", str(svg), *extra]) == 0
    return md.read_text(), ET.fromstring(svg.read_text())  # well-formed XML, or this raises


def test_table_cells_per_family(results: Path, tmp_path: Path) -> None:
    text, _ = _draw(results, tmp_path)
    # Llama: two checkpoints passed; Qwen 3 failed; Gemma 3 an expected failure. beta ran Qwen 3 only.
    assert "| `test_generated_logprobs_agree_with_oracle` | ✓ / ✗ / x | · / ✓ / · |" in text
    # one Llama checkpoint, the test's own parameter 1 passed and 2 skipped: counts, as the cases differ
    assert "| `test_max_tokens_exact` | ✓1 –1 / · / · | · / · / · |" in text
    assert "| `test_batch_matches_alone` | · / · / ✓ | · / · / · |" in text
    # groups in the tier's order, agreement apart from self-consistency
    order = [text.index(g) for g in ("**agreement with the float64 oracle**", "**self-consistency", "**stopping**")]
    assert order == sorted(order)
    assert "beta<br>beta 1.0 (offline)" in text and "alpha<br>version not recorded" in text
    assert "largest difference from the oracle: 2e-06 nats" in text and "something else" not in text
    assert "**alpha** (version not recorded, float32): 4 passed, 1 expected failure, 1 failed, 1 not supported or skipped" in text
    assert "tolerances not recorded (no report JSON)" in text


def test_svg_has_one_cell_per_property_engine_family(results: Path, tmp_path: Path) -> None:
    _, svg = _draw(results, tmp_path)
    children = list(svg)
    cells = {}
    for i, child in enumerate(children):
        if child.tag.endswith("rect") and child.get("class") == "cell":
            key = (child.get("data-property"), child.get("data-engine"), child.get("data-family"))
            assert key not in cells
            cells[key] = children[i + 1].text  # the mark drawn on it
    properties = ["test_generated_logprobs_agree_with_oracle", "test_batch_matches_alone", "test_max_tokens_exact"]
    assert set(cells) == {(p, e, f) for p in properties for e in ("alpha", "beta") for f in ("Llama", "Qwen 3", "Gemma 3")}
    assert cells[("test_generated_logprobs_agree_with_oracle", "alpha", "Qwen 3")] == "✗"
    assert cells[("test_generated_logprobs_agree_with_oracle", "alpha", "Gemma 3")] == "x"
    assert cells[("test_max_tokens_exact", "alpha", "Llama")] == "✓1 –1"
    assert cells[("test_generated_logprobs_agree_with_oracle", "beta", "Llama")] == "·"


def test_xfails_applied_to_a_run_made_without_them(results: Path, tmp_path: Path) -> None:
    listed = tmp_path / "alpha.txt"
    listed.write_text("# cause\ntest_agreement.py::test_generated_logprobs_agree_with_oracle[qwen3  # why\n"
                      "test_agreement.py::test_generated_logprobs_agree_with_oracle[llama-tiny\n")  # fmt: skip
    text, _ = _draw(results, tmp_path, "--xfails", f"alpha={listed}", "--version", "alpha=alpha 2.0")
    # Qwen 3's failure is listed: expected. llama-tiny passed though listed: a strict xfail fails.
    assert "| `test_generated_logprobs_agree_with_oracle` | ✓1 ✗1 / x / x |" in text
    assert "alpha<br>alpha 2.0" in text and "failures listed in `alpha.txt` counted as expected" in text


def test_family_from_config_then_name(tmp_path: Path) -> None:
    for name, model_type in (("mystery", "qwen3"), ("llama-named", "gemma3_text")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps({"model_type": model_type}))
    assert family_of("mystery", [tmp_path]) == "Qwen 3"
    assert family_of("llama-named", [tmp_path]) == "Gemma 3"  # the config, not the name
    assert family_of("gemma3-window40-gqa4-qpas20-globalrope-linear-t4", [tmp_path]) == "Gemma 3"
    assert family_of("llama3-ropescaling-mha-untied-t5", [tmp_path]) == "Llama"
    assert family_of("phi-tiny", [tmp_path]) == "phi-tiny"
    fixtures = Path(__file__).resolve().parents[2] / "fixtures" / "checkpoints"
    assert [family_of(n, [fixtures]) for n in ("llama-tiny", "qwen3-tiny", "gemma3-tiny")] == ["Llama", "Qwen 3", "Gemma 3"]


def test_grid_keeps_a_module_it_does_not_know_as_its_own_group(tmp_path: Path) -> None:
    _write(tmp_path, "e", [("test_new_things", "test_y[llama-tiny]", "passed")])
    grid = build_grid([load_result("e", tmp_path / "e.xml")])
    assert [title for title, _ in grid.groups] == ["new things"]


def test_single_engine_table_still_works(results: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(results / "alpha.xml"), "Alpha 1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("**Alpha 1**")
    assert "| `test_generated_logprobs_agree_with_oracle` | ✓ | ✓ | ✗ | x |" in out


def test_missing_venv_is_one_line_and_nothing_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    monkeypatch.setenv("INFER_REF_VLLM_PYTHON", str(tmp_path / "no-venv" / "bin" / "python"))
    ran: list[Sequence[str]] = []
    said: list[str] = []
    assert run_engines(["vllm"], tmp_path / "out", runner=lambda cmd, log: ran.append(cmd) or 0, say=said.append) == {}
    assert ran == [] and len(said) == 1
    assert said[0].startswith("vllm: left out: $INFER_REF_VLLM_PYTHON names ") and "install_vllm.sh" in said[0]
    # the command: that line, then one error line (nothing else to draw), no traceback
    assert main(["--engines", "vllm", "--out", str(tmp_path / "out2")]) == 2
    captured = capsys.readouterr()
    assert captured.out.count("\n") == 1 and captured.out.startswith("vllm: left out")
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err


def test_run_mode_runs_each_tier_with_its_xfails_then_draws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[list[str]] = []

    def fake_tier(command: Sequence[str], log: Path) -> int:
        ran.append(list(command))
        _write(log.parent, "infer_ref", BETA, BETA_NOTES)
        return 0

    assert run_engines(["infer_ref"], tmp_path, runner=fake_tier, say=lambda _: None) == {"infer_ref": 0}
    [command] = ran
    assert command[command.index("--engine") + 1] == "infer_ref" and "--xfails" not in command
    assert command[command.index("--report") + 1] == str(tmp_path / "infer_ref.json")
    assert f"--junitxml={tmp_path / 'infer_ref.xml'}" in command
    vllm = tier_command("vllm", tmp_path)
    assert Path(vllm[vllm.index("--xfails") + 1]).name == "vllm-cpu.txt" and Path(vllm[vllm.index("--xfails") + 1]).is_file()
    # a column of another dtype runs the same engine at that dtype, its results under the column's name
    half = tier_command("llama.cpp-float16", tmp_path)
    assert half[half.index("--engine") + 1] == "llama.cpp" and half[half.index("--dtype") + 1] == "float16"
    assert half[half.index("--report") + 1] == str(tmp_path / "llama.cpp-float16.json") and "--dtype" not in vllm


@pytest.mark.parametrize(("argv", "expected"), [
    (["--engines", "nonesuch", "--out", "x"], "--engines nonesuch: not an engine the matrix runs"),
    (["--engines", "vllm"], "--engines needs --out DIR"),
    (["--results", "r", "--engines", "vllm", "--out", "x"], "give --engines E ... --out DIR (run, then draw) or --results DIR"),
    (["--results", "no-such-folder"], "--results no-such-folder: no such folder"),
    (["no-such.xml", "T"], "no-such.xml: not a readable JUnit XML report"),
])  # fmt: skip
def test_user_mistakes_get_one_line(argv: list[str], expected: str, capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert expected in err and err.count("\n") == 1


def test_bad_pair_option(results: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--results", str(results), "--version", "alpha", "--md", str(tmp_path / "m.md"), "--svg", str(tmp_path / "m.svg")]) == 2
    assert "--version 'alpha': expected ENGINE=VALUE" in capsys.readouterr().err
    assert not (tmp_path / "m.md").exists()


def test_run_mode_says_what_a_failing_exit_status_meant(tmp_path: Path) -> None:
    def failing_tier(command: Sequence[str], log: Path) -> int:
        _write(log.parent, "infer_ref", BETA)
        (log.parent / "infer_ref.json").write_text(json.dumps({"totals": {"counts": {"failed": 2}}, "stale_xfails": ["a"]}))
        return 1

    said: list[str] = []
    assert run_engines(["infer_ref"], tmp_path, runner=failing_tier, say=said.append) == {"infer_ref": 1}
    assert "exit status 1: 2 failed, 1 stale xfail entries" in said[0]


def test_run_mode_draws_then_fails_when_a_tier_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from infer_ref.conformance.engines.matrix import main as command

    def tier_exits(status: int):  # type: ignore[no-untyped-def]
        def fake(engines: Sequence[str], out: Path, model_dirs: Sequence[Path], long_context: bool = False) -> dict[str, int]:
            _write(out, "infer_ref", BETA, BETA_NOTES)
            return {"infer_ref": status}
        return fake

    argv = ["--engines", "infer_ref", "--out", str(tmp_path / "r"), "--md", str(tmp_path / "m.md"), "--svg", str(tmp_path / "m.svg")]
    monkeypatch.setattr(command, "run_engines", tier_exits(1))
    assert main(argv) == 1 and (tmp_path / "m.md").is_file() and (tmp_path / "m.svg").is_file()
    monkeypatch.setattr(command, "run_engines", tier_exits(0))
    assert main(argv) == 0


def test_a_runs_time_and_date_come_from_its_junit_file(tmp_path: Path) -> None:
    from infer_ref.conformance.engines.matrix.results import read_run

    timed = tmp_path / "timed.xml"
    timed.write_text('<testsuites><testsuite name="pytest" time="96.6" timestamp="2026-11-27T06:08:57.6+00:00">'
                     "</testsuite></testsuites>")  # fmt: skip
    assert read_run(timed) == "ran 97 s on 2026-11-27"
    bare = tmp_path / "bare.xml"
    bare.write_text('<testsuites><testsuite name="pytest"></testsuite></testsuites>')
    assert read_run(bare) == ""


def test_long_context_results_join_the_engines_column(results: Path, tmp_path: Path) -> None:
    """``RESULTS/long/E.xml`` (a ``--long-context`` run) adds its rows and tolerance notes to E's column."""
    long_notes = ["engine: beta 1.0 (offline)",
                  "largest difference from the oracle: 2.5e-03 nats (test_y[qwen3-long-t4], 2 answers); tolerance 0.005 (at 8448 positions)"]  # fmt: skip
    _write(results / "long", "beta", [("test_long_context", "test_long_prompts_agree_with_oracle[qwen3-long-t4]", "failed")], long_notes)
    text, _ = _draw(results, tmp_path)
    assert "**long contexts (prompts to 8193 positions: --long-context)**" in text
    assert "| `test_long_prompts_agree_with_oracle` | · / · / · | · / ✗ / · |" in text  # beta's Qwen 3 cell; alpha ran none
    assert "long contexts: largest difference from the oracle: 2.5e-03 nats" in text
    assert "**beta** (beta 1.0 (offline), float32): 1 passed, 1 failed" in text
