"""The engine tier's notes reach the report whichever process ran the tests (old: under xdist the
workers kept them, so the largest distance past a tolerance never stood beside the verdict)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from infer_ref.conformance.engines.notes import write_notes
from infer_ref.conformance.engines.protocol import CAPABILITIES
from infer_ref.conformance.report import Report

ROOT = Path(__file__).resolve().parents[2]


def _state(largest: float, where: str, comparisons: int, hits: list[list[int]], left_out: list[str]) -> dict:  # type: ignore[type-arg]
    return {"name": "my-engine", "engine": "my-engine 1.0", "options": [],
            "logs": [{"what": "from the oracle", "largest": largest, "where": where, "comparisons": comparisons,
                      "tolerance": 2e-4, "source": "the oracle tolerance for float32"}],
            "prefix_hits": hits, "left_out": left_out, "requests_read": 10}  # fmt: skip


def test_two_workers_merge_into_one_set_of_notes() -> None:
    report = Report(impl="--ir-engine=x", adapter="engine tier:", version="x", device="the engine's", dtype="float32", capabilities={})
    write_notes(report, [_state(1e-5, "test_a[llama-tiny]", 40, [[97, 96]], []),
                         _state(3e-3, "test_b[qwen3-tiny]", 60, [[65, 32]], ["Unsupported: why"])])  # fmt: skip
    far = ("largest difference from the oracle: 0.003 nats (test_b[qwen3-tiny], 100 answers); "
           "tolerance 0.0002 (the oracle tolerance for float32)")  # the larger of the two, the comparisons summed
    assert report.notes == [
        "engine: my-engine 1.0",
        far,
        "prefix cache hits observed: 2 of 2 extending requests hit, 128 of 162 shared prompt tokens served from cache, "
        "in multiples of 32 tokens",
        "requests left out because my-engine's answer cannot be read back as token ids: 1 of 20 (1× Unsupported: why)",
    ]
    assert report.beyond_tolerance == [far]


def test_conversations_not_continued_are_noted_from_every_worker() -> None:
    report = Report(impl="--ir-engine=x", adapter="engine tier:", version="x", device="the engine's", dtype="float32", capabilities={})
    one, other = _state(0.0, "", 0, [], []), _state(0.0, "", 0, [], [])
    one["not_continued"], other["not_continued"] = ["a: why one"], ["b: why two"]
    write_notes(report, [one, other])
    assert report.notes[-1] == ("conversations not continued, so not judged, because their history cannot be sent as text: 2 "
                                "(a: why one; b: why two)")  # fmt: skip


def test_the_report_lists_the_capabilities_the_engine_declared() -> None:
    report = Report(impl="--ir-engine=x", adapter="engine tier:", version="x", device="the engine's", dtype="float32", capabilities={})
    never_reached, declared = _state(0.0, "", 0, [], []), _state(0.0, "", 0, [], [])
    never_reached["capabilities"], declared["capabilities"] = None, ["batch", "top_logprobs"]
    write_notes(report, [never_reached, declared])
    assert report.capabilities == {c: None if c in ("batch", "top_logprobs") else "not declared" for c in CAPABILITIES}
    assert len(CAPABILITIES) > 2  # the others are listed as not declared


@pytest.mark.kit_run
def test_the_notes_arrive_under_xdist(tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    cmd = [sys.executable, "-m", "infer_ref.cli", "conformance", "--engine", "infer_ref", "-n", "2",
           "--model-dir", str(ROOT / "fixtures" / "checkpoints" / "llama-tiny"), "--report", str(report),
           "-k", "test_generated_logprobs_agree_with_oracle or test_batch_matches_alone"]  # fmt: skip
    done = subprocess.run(cmd, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:]
    notes = json.loads(report.read_text())["notes"]
    assert any(n.startswith("largest difference from the oracle: ") for n in notes), notes
    assert any(n.startswith("largest difference between two schedules: ") for n in notes), notes
