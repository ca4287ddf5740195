"""The ``infer-ref`` command, run as a user runs it: in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COUNT_TO_TEN = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10."  # the corpus answer to "Count to ten."

def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "INFER_REF_MODELS": ""}
    return subprocess.run(
        [sys.executable, "-m", "infer_ref.cli", *args], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT
    )


def test_default_run_streams_answer_and_metrics() -> None:
    proc = _run("generate", "--device", "cpu")
    assert proc.returncode == 0, proc.stderr
    assert COUNT_TO_TEN in proc.stdout
    for line in ("finish: eos", "kv cache:", "time_to_first_token_ms:", "decode_tokens_per_second:", "per_forward_ms: min"):
        assert line in proc.stdout


def test_json_output_is_one_object() -> None:
    proc = _run("generate", "Count to ten.", "--device", "cpu", "--json", "--no-kv-cache")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["text"] == COUNT_TO_TEN and report["finish_reason"] == "eos"
    assert report["use_kv_cache"] is False and report["metrics"]["cache_memory_mb"] is None
    assert report["generated_tokens"] == len(report["token_ids"]) == report["metrics"]["per_forward_ms"]["n"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--model", "no-such-model"), "was not found"),
        (("--device", "mps"), "unsupported device 'mps'"),
        (("--device", "warp9"), "unsupported device 'warp9'"),
        (("--max-new-tokens", "100000"), "exceeds the model's context"),
        (("--temperature", "-1"), "temperature must be >= 0"),
        (("--dtype", "int8"), "invalid choice: 'int8'"),
        (("--fast", "--no-kv-cache"), "cannot be combined with --no-kv-cache"),
        (("--compile",), "--compile compiles the fast decode step: add --fast"),
        (("--fast", "--compile"), "--compile needs a CUDA device"),
    ],
)
def test_usage_errors_exit_2_without_traceback(args: tuple[str, ...], message: str) -> None:
    proc = _run("generate", "--device", "cpu", *args) if "--device" not in args else _run("generate", *args)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the no-CUDA message")
def test_cuda_requested_without_cuda() -> None:
    proc = _run("generate", "--device", "cuda")
    assert proc.returncode == 2 and "CUDA is not available" in proc.stderr


def test_fast_decode_gives_the_eager_answer() -> None:
    proc = _run("generate", "--device", "cpu", "--fast", "--json", "--model", "gemma3-tiny", "--max-new-tokens", "200", "Count to thirty.")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["decode"] == "fast" and report["finish_reason"] == "eos"
    assert report["text"] == ", ".join(str(i) for i in range(1, 31)) + "."


def test_golden_verify_through_the_main_command() -> None:
    proc = _run("golden", "verify", "fixtures/golden/qwen3-tiny.cpu-float32.json")
    assert proc.returncode == 0, proc.stderr
    assert "PASS" in proc.stdout


def test_no_command_prints_help_and_exits_2() -> None:
    proc = _run()
    assert proc.returncode == 2 and "generate" in proc.stdout
