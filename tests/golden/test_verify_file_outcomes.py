"""``verify_file`` end to end on the tiny Llama fixture's model, with someone else's sessions.

The golden file is the fixture's metadata with two small cases written here: their golden steps
are the float64 log-softmax (the oracle) of the logits a scripted implementation returns, so a
script that returns them passes exactly and one that prefers another token at a step fails at
that step. No model runs: the checkpoint is read only for its config, weights digest and
tokenizer, as for any implementation verified against the file."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor

from infer_ref.conformance.oracles import golden
from infer_ref.conformance.oracles.golden.writing import device_name, run_versions

pytest.importorskip("transformers")

FIXTURE = golden.GOLDEN_DIR / "llama-tiny.cpu-float32.json"
EOS = 434  # the tiny Llama's <|end_of_text|>, a special token
# (tokens fed) -> the token the scripted implementation puts first; the golden file's cases follow it
SCRIPT = {(1, 2, 3): 16, (16,): 328, (4, 5): 20, (20,): EOS}


def _logits(best: int, vocab: int) -> Tensor:
    logits = -0.01 * torch.arange(vocab, dtype=torch.float32)  # [V]: distinct, descending by id
    logits[best] = 5.0
    return logits


def _sessions(script: Mapping[tuple[int, ...], int], vocab: int) -> golden.SessionFactory:
    def start(capacity: int) -> golden.StepFn:
        def step(tokens: Sequence[int]) -> Tensor:
            return _logits(script[tuple(tokens)], vocab)

        return step

    return start


def _step(best: int, vocab: int, top_k: int) -> dict[str, Any]:
    lp = torch.log_softmax(_logits(best, vocab).double(), dim=-1)  # the float64 oracle
    values, ids = lp.topk(top_k)
    return {"token": best, "top_ids": ids.tolist(), "top_logprobs": values.tolist()}


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    """The fixture's metadata with this machine's versions (no notes) and two scripted cases."""
    doc = golden.load_golden(FIXTURE)
    vocab, top_k = doc["model"]["hf_config"]["vocab_size"], doc["sampling"]["top_k"]
    doc["run"].update(device_name=device_name("cpu"), **run_versions())
    doc["cases"] = [
        {"name": "first", "prompt_text": None, "prompt_ids": [1, 2, 3], "max_new_tokens": 2,
         "steps": [_step(16, vocab, top_k), _step(328, vocab, top_k)]},
        {"name": "second", "prompt_text": None, "prompt_ids": [4, 5], "max_new_tokens": 3,
         "steps": [_step(20, vocab, top_k), _step(EOS, vocab, top_k)]},  # ends at its EOS
    ]  # fmt: skip
    return doc


def _file(doc: Mapping[str, Any], folder: Path) -> Path:
    path = folder / "g.json"
    path.write_text(json.dumps(golden.seal(doc)), encoding="utf-8")
    return path


def test_a_matching_implementation_passes_with_a_report_of_what_ran(doc: dict[str, Any], tmp_path: Path) -> None:
    doc = {**doc, "run": {**doc["run"], "torch": "0.0-golden"}}  # only a note, never a failure
    path = _file(doc, tmp_path)
    progress: list[int] = []
    vocab = doc["model"]["hf_config"]["vocab_size"]
    report = golden.verify_file(path, impl="theirs", sessions=_sessions(SCRIPT, vocab), progress=progress.append)
    assert report.ok and [c.free_match for c in report.cases] == [2, 2]
    assert (report.path, report.impl, report.dtype, report.device) == (str(path.resolve()), "theirs", "float32", "cpu")
    assert progress == [2, 2]  # steps done, one call per case
    assert report.notes == [f"torch: golden file '0.0-golden', this run {torch.__version__!r}"]


def test_a_wrong_token_fails_naming_the_step_position_values_and_special_token_text(
    doc: dict[str, Any], tmp_path: Path
) -> None:
    path = _file(doc, tmp_path)
    vocab = doc["model"]["hf_config"]["vocab_size"]
    theirs = {**SCRIPT, (20,): 21}  # the second case's last step: 21 instead of the golden EOS
    with pytest.raises(golden.GoldenMismatch) as caught:
        golden.verify_file(path, impl="theirs", sessions=_sessions(theirs, vocab))
    lp = torch.log_softmax(_logits(21, vocab).double(), dim=-1)  # what the implementation said there
    lines = str(caught.value).split("\n")
    assert lines[1] == "  case 'second' (prompt 2 tokens): 1 of 2 steps fail; first at step 1 (token position 3)"
    assert lines[2] == (
        f"    golden token {EOS} ('<|end_of_text|>'): logprob {float(lp[EOS]):.4f} here; our best is 21 ('6') at "
        f"{float(lp[21]):.4f}: margin (our best - golden) {float(lp[21] - lp[EOS]):.4f}"
    )
    assert f"{EOS} '<|end_of_text|>':" in lines[5]  # golden top-k, special token shown
    assert caught.value.report.impl == "theirs" and not caught.value.report.ok
    report = golden.verify_file(path, sessions=_sessions(theirs, vocab), raise_on_failure=False)
    assert [len(c.failures) for c in report.cases] == [0, 1]


def test_the_checkpoint_given_replaces_the_recorded_one(doc: dict[str, Any], tmp_path: Path) -> None:
    path = _file(doc, tmp_path)
    other = golden.REPO_ROOT / "fixtures" / "checkpoints" / "qwen3-tiny"
    with pytest.raises(golden.GoldenMetadataMismatch) as caught:
        golden.verify_file(path, checkpoint=other, sessions=_sessions(SCRIPT, 1))
    assert caught.value.fields["model_type"] == ("llama", "qwen3")
    assert caught.value.path == str(path.resolve())  # the file named as the user gave it
