"""``infer-ref generate`` with several prompts (the engine), run as a user runs it: in a subprocess."""

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
    env = {**os.environ, "PYTHONPATH": str(ROOT), "INFER_REF_MODELS": "", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "infer_ref.cli", *args], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT
    )


def test_several_prompts_share_the_system_prompt_and_match_single_runs(tmp_path: Path) -> None:
    prompts_file = tmp_path / "prompts.txt"
    prompts_file.write_text("Count to ten.\n\nName a fruit.\n")
    common = ("--device", "cpu", "--max-new-tokens", "16", "--system", "Be brief.")
    proc = _run("generate", "--prompt", "Count to ten.", "--prompts-file", str(prompts_file), *common,
                "--block-size", "4", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    requests = report["requests"]
    assert len(requests) == 3  # the blank line is skipped
    # Requests 1 and 2 find the shared chat header + system prompt cached; request 1 repeats request 0.
    assert requests[0]["num_cached_tokens"] == 0
    assert requests[1]["num_cached_tokens"] == 4 * ((requests[1]["prompt_tokens"] - 1) // 4)
    assert 0 < requests[2]["num_cached_tokens"] < requests[2]["prompt_tokens"]
    m = report["metrics"]
    assert m["prompt_tokens"] == sum(r["prompt_tokens"] for r in requests)
    assert m["cached_prompt_tokens"] == sum(r["num_cached_tokens"] for r in requests)
    assert m["prefill_tokens_computed"] == m["prompt_tokens"] - m["cached_prompt_tokens"]
    assert m["prefix_hit_rate"] == pytest.approx(m["cached_prompt_tokens"] / m["prompt_tokens"], abs=1e-4)
    assert 0 < m["peak_blocks_used"] <= report["engine"]["num_blocks"]
    # The same two prompts without prefix caching give the same outputs.
    cold = json.loads(_run("generate", "--prompt", "Count to ten.", "--prompt", "Name a fruit.", *common,
                           "--no-prefix-caching", "--json").stdout)
    assert [r["token_ids"] for r in cold["requests"]] == [requests[0]["token_ids"], requests[2]["token_ids"]]
    assert cold["metrics"]["prefix_hit_rate"] == 0


def test_several_prompts_without_system_give_each_single_prompt_answer() -> None:
    proc = _run("generate", "--prompt", "Count to ten.", "--prompt", "Count to ten.", "--device", "cpu")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count(COUNT_TO_TEN) == 2
    for line in ("prefix_hit_rate:", "prefill_tokens_computed:", "peak_blocks_used:", "throughput:"):
        assert line in proc.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--system", "Be brief."), "--system needs at least one prompt"),
        (("--prompt", "a", "--fast"), "apply to one prompt"),
        (("--prompt", "a", "--block-size", "0"), "--block-size must be a positive integer"),
        (("--prompt", "a", "--num-blocks", "0"), "--num-blocks must be a positive integer, got 0"),  # not the default
        (("--prompt", "a", "--num-blocks", "1"), "could never run"),
    ],
)
def test_bad_multi_prompt_options_are_usage_errors(args: tuple[str, ...], message: str) -> None:
    proc = _run("generate", *args, "--device", "cpu")
    assert proc.returncode == 2, proc.stdout
    assert message in proc.stderr


def test_a_missing_prompts_file_is_a_missing_file() -> None:
    proc = _run("generate", "--prompts-file", "/nonexistent/prompts.txt", "--device", "cpu")
    assert proc.returncode == 5, proc.stdout  # docs/errors.md: a file named on the command line does not exist
    assert "--prompts-file /nonexistent/prompts.txt: no such file" in proc.stderr
