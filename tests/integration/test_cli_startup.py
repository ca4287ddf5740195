"""What the ``infer-ref`` command imports before it answers: ``--help`` and every usage error come
back before torch, pytest or a model is touched (the table of docs/errors.md, run row by row: the
command, its exit code, its one line), and ``generate`` never imports the test stack.

Each case runs the command's ``main`` in a fresh interpreter and prints the heavy modules it
imported: a module list, not a timing, so the check is the same on a loaded machine.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from infer_ref.device_names import torch_gpu_build

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "pytest", "hypothesis", "torch._dynamo")

PROBE = """
import contextlib, io, json, os, sys
from infer_ref.cli import main
err = io.StringIO()  # both streams: golden verify reports each file on stdout
with contextlib.redirect_stdout(err), contextlib.redirect_stderr(err):
    try:
        code = main(sys.argv[1:])
    except SystemExit as exit:
        code = exit.code
heavy = [m for m in os.environ["HEAVY"].split() if m in sys.modules]
print(json.dumps({"code": code, "output": err.getvalue(), "heavy": heavy}))
"""


def _imports(*args: str, cwd: Path) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not (k.startswith("INFER_REF_") and k.endswith("_PYTHON"))}  # no engine venv
    env |= {"PYTHONPATH": str(ROOT), "INFER_REF_MODELS": "", "HEAVY": " ".join(HEAVY)}
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


ERRORS_DOC = ROOT / "docs" / "errors.md"
BROKEN_ENGINE = 'def start(model_dir, options):\n    raise RuntimeError("no accelerator on this machine")\n'
TABLE_HEADER = "| command | exit | the line begins | answered before importing |"


def documented_usage_errors() -> list[tuple[list[str], int, str, list[str]]]:
    """docs/errors.md's table of usage errors: (argv after ``infer-ref``, exit code, the line's
    beginning, the modules the refusal comes before)."""
    lines = ERRORS_DOC.read_text(encoding="utf-8").splitlines()
    rows = lines[lines.index(TABLE_HEADER) + 2:]
    out = []
    for row in rows[: next((i for i, line in enumerate(rows) if not line.startswith("|")), len(rows))]:
        command, code, line, before = (cell.strip().strip("`") for cell in row.strip("|").split(" | "))
        assert command.startswith("infer-ref "), row
        out.append((shlex.split(command)[1:], int(code), line, [m.strip() for m in before.split(",")]))
    return out


def test_the_table_of_usage_errors_is_there_and_covers_every_command() -> None:
    commands = {argv[0] for argv, _, _, _ in documented_usage_errors()}
    assert {"generate", "golden", "conformance"} <= commands, commands


@pytest.mark.parametrize(
    ("args", "code", "line", "before"), documented_usage_errors(), ids=[" ".join(row[0]) for row in documented_usage_errors()]
)
def test_every_documented_usage_error_is_one_line_before_torch_or_pytest(
    args: list[str], code: int, line: str, before: list[str], tmp_path: Path
) -> None:
    if "cuda" in args and __import__("torch").cuda.is_available():
        pytest.skip("the row refuses CUDA on a machine without it")
    (tmp_path / "empty-folder").mkdir()
    (tmp_path / "existing.json").write_text("{}", encoding="utf-8")
    (tmp_path / "checkpoint").mkdir()
    (tmp_path / "checkpoint" / "config.json").write_text("{}", encoding="utf-8")
    (tmp_path / "broken_engine.py").write_text(BROKEN_ENGINE, encoding="utf-8")
    seen = _imports(*args, cwd=tmp_path)
    output = str(seen["output"]).splitlines()
    assert seen["code"] == code, seen
    assert len(output) == 1 and output[0].startswith(line), f"expected one line beginning {line!r}, got {output}"
    if "cuda" in args and torch_gpu_build():
        # A torch built with CUDA (PyPI's for Linux) on a machine without a GPU: only torch's own
        # runtime check can say there is no device, so torch is imported; the rest still is not.
        before = [m for m in before if m != "torch"]
    imported = [m for m in before if m in seen["heavy"]]
    assert imported == [], f"{' '.join(args)} imported {imported} before answering"
    assert (tmp_path / "existing.json").read_text(encoding="utf-8") == "{}"  # a refusal leaves files as they were


@pytest.mark.parametrize("args", [["--help"], ["generate", "--help"], ["conformance", "--help"], ["golden", "--help"]], ids=" ".join)
def test_help_imports_nothing_heavy(args: list[str], tmp_path: Path) -> None:
    seen = _imports(*args, cwd=tmp_path)
    assert seen["code"] == 0 and seen["heavy"] == [], seen


@pytest.mark.parametrize("option", ["--bogus-opt", "-z", "--maxfail=1 --no-such-flag=3"])
def test_an_option_neither_the_command_nor_pytest_takes_is_refused_before_torch(option: str, tmp_path: Path) -> None:
    # Unknown options go to pytest; checking them needs pytest's parser (pytest is imported), never
    # infer_ref's plugin, which imports torch.
    seen = _imports("conformance", *option.split(), cwd=tmp_path)
    bad = option.split()[-1]
    assert seen["code"] == 2 and f"unknown option {bad}: neither infer-ref conformance nor pytest takes it" in str(seen["output"]), seen
    assert "torch" not in seen["heavy"] and "transformers" not in seen["heavy"], seen


def test_pytest_options_and_those_after_the_separator_pass_the_check() -> None:
    from infer_ref.cli.conformance import check_pytest_options

    check_pytest_options(["-x", "-q", "--maxfail=1", "-vv", "--junitxml=r.xml", "--hypothesis-show-statistics", "--ir-device=cpu"])
    check_pytest_options(["--", "--anything-goes-to-pytest"])  # after --: pytest's alone
    check_pytest_options(["-p", "my_plugin", "--my-plugin-option"])  # another plugin loads: pytest decides


def test_generate_imports_neither_transformers_nor_the_test_stack_nor_dynamo(tmp_path: Path) -> None:
    seen = _imports("generate", "Count to ten.", "--device", "cpu", "--max-new-tokens", "3", cwd=tmp_path)
    assert seen["code"] == 0, seen
    # torch is what generate runs on; building the model on meta must not import torch._dynamo
    # (1.5 s: torch's meta kernels for random initialisers and arithmetic import it on first use).
    assert seen["heavy"] == ["torch"], seen
