"""What the ``infer-ref`` command imports before it answers: ``--help`` and every usage error come
back before torch, pytest or a model is touched, and ``generate`` never imports the test stack.

Each case runs the command's ``main`` in a fresh interpreter and prints the heavy modules it
imported: a module list, not a timing, so the check is the same on a loaded machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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
    env = {**os.environ, "PYTHONPATH": str(ROOT), "INFER_REF_MODELS": "", "HEAVY": " ".join(HEAVY)}
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--help"], 0, ""),
        (["generate", "--help"], 0, ""),
        (["conformance", "--help"], 0, ""),
        (["generate", "--dtype", "float8"], 2, "invalid choice: 'float8'"),
        (["generate", "--model", "no-such-model"], 2, "no-such-model"),
        (["generate", "--cache", "ring"], 2, "invalid choice: 'ring'"),
        (["conformance", "--engine", "vlm"], 2, "--engine 'vlm': expected one of infer_ref, transformers"),
        (["conformance", "--impl", "no_such_module:ADAPTER"], 2, "--impl 'no_such_module:ADAPTER': no module 'no_such_module'"),
        (["conformance", "--impl", "no_such_package.adapters"], 2, "no module 'no_such_package.adapters' on the path"),
        (["conformance", "--xfails", "no-such-file.txt"], 5, "--xfails no-such-file.txt: no such file"),
        (["conformance", "--engine", "infer_ref", "--report", "no-such-folder/report.md"], 5, "no-such-folder does not exist"),
        (["conformance", "--engine", "infer_ref", "--endpoint", "http://127.0.0.1:1/v1"], 2, "give one of them"),
        (["conformance", "--model-dir", str(ROOT / "fixtures" / "checkpoints" / "llama-tiny")], 2, "add --engine ENGINE"),
        (["golden", "--help"], 0, ""),
        (["golden", "verify", "no-such-file.json"], 5, "no-such-file.json: no such file"),
        (["golden", "generate", "--dtype", "int8"], 2, "invalid choice: 'int8'"),
    ],
    ids=lambda v: " ".join(v).replace(str(ROOT), "ROOT") if isinstance(v, list) else None,
)
def test_help_and_usage_errors_import_nothing_heavy(args: list[str], code: int, message: str, tmp_path: Path) -> None:
    seen = _imports(*args, cwd=tmp_path)  # relative paths name nothing there
    assert seen["code"] == code, seen
    assert message in str(seen["output"]), seen
    assert seen["heavy"] == [], f"{' '.join(args)} imported {seen['heavy']} before answering"


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
