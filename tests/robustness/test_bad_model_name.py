"""``--model NAME`` when NAME is both an embedded fixture and a folder of the user's.

The choice (docs/errors.md): a bare name that matches both is refused as ambiguous, naming both
folders (exit 2); a path (``./llama-tiny``, an absolute path) is never ambiguous and runs what it
points at. The user's ``llama-tiny`` here is a copy of the Qwen3 fixture, so the output's
``model_type`` tells which folder ran.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from infer_ref.errors import EXIT_OK, EXIT_USAGE

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "fixtures" / "checkpoints"
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}
GEN = ["--device", "cpu", "--max-new-tokens", "2", "--json", "--no-chat", "hello"]


def _run(cases: list[list[Any]], cwd: Path, models: str = "") -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("cli_driver.py"))],
        input=json.dumps(cases), capture_output=True, text=True, env={**ENV, "INFER_REF_MODELS": models}, cwd=cwd, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """Both lookups that can collide with a fixture name: the working directory and $INFER_REF_MODELS."""
    root = tmp_path_factory.mktemp("model-name")
    work = root / "work"
    shutil.copytree(FIXTURES / "qwen3-tiny", work / "llama-tiny")  # the user's own "llama-tiny"
    shutil.copytree(FIXTURES / "qwen3-tiny", root / "models" / "gemma3-tiny")
    empty = root / "empty"
    empty.mkdir()
    results = _run(
        [
            ["bare-name", ["generate", "--model", "llama-tiny", *GEN]],
            ["dot-slash", ["generate", "--model", "./llama-tiny", *GEN]],
            ["fixture-path", ["generate", "--model", str(FIXTURES / "llama-tiny"), *GEN]],
        ],
        cwd=work,
    )
    results.update(_run([["no-collision", ["generate", "--model", "llama-tiny", *GEN]]], cwd=empty))
    results.update(_run([["env-collision", ["generate", "--model", "gemma3-tiny", *GEN]]], cwd=empty, models=str(root / "models")))
    return root, results


def _model_type(result: dict[str, Any]) -> str:
    assert result["code"] == EXIT_OK, result["stderr"]
    return str(json.loads(result["stdout"])["model_type"])


@pytest.mark.parametrize(
    ("case_id", "fixture", "theirs"),
    [("bare-name", "llama-tiny", "work/llama-tiny"), ("env-collision", "gemma3-tiny", "models/gemma3-tiny")],
    ids=["cli-model-name-ambiguous-with-working-directory", "cli-model-name-ambiguous-with-models-folder"],
)
def test_a_bare_name_matching_a_fixture_and_a_folder_is_refused_naming_both(
    ran: tuple[Path, dict[str, Any]], case_id: str, fixture: str, theirs: str
) -> None:
    root, results = ran
    result = results[case_id]
    assert result["code"] == EXIT_USAGE, result
    assert result["stdout"] == ""  # nothing generated
    error = result["stderr"].strip()
    assert "\n" not in error and "Traceback" not in error
    assert f"model name '{fixture}' is ambiguous" in error
    assert str(FIXTURES / fixture) in error and str((root / theirs).resolve()) in error


def test_cli_model_path_picks_the_users_folder(ran: tuple[Path, dict[str, Any]]) -> None:
    assert _model_type(ran[1]["dot-slash"]) == "qwen3"


def test_cli_model_fixture_path_picks_the_fixture(ran: tuple[Path, dict[str, Any]]) -> None:
    assert _model_type(ran[1]["fixture-path"]) == "llama"


def test_cli_model_bare_fixture_name_without_a_collision_is_the_fixture(ran: tuple[Path, dict[str, Any]]) -> None:
    assert _model_type(ran[1]["no-collision"]) == "llama"
