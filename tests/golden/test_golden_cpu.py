"""CPU golden files of the fixture checkpoints (float32), verified in the default tier.

``fixtures/golden/<family>-tiny.cpu-float32.json`` were written by transformers from the trained
fixture checkpoints and their canonical chat prompts. Regenerate with
``infer-ref golden generate --checkpoint fixtures/checkpoints/<family>-tiny --dtype float32 --device cpu --force``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from infer_ref.conformance.oracles import golden

pytest.importorskip("transformers")

FAMILIES = ("llama", "qwen3", "gemma3")


def _file(family: str) -> Path:
    path = golden.GOLDEN_DIR / f"{family}-tiny.cpu-float32.json"
    if not path.is_file():
        pytest.fail(
            f"{path} is missing: generate it with `infer-ref golden generate --checkpoint "
            f"fixtures/checkpoints/{family}-tiny --dtype float32 --device cpu`"
        )
    return path


@pytest.mark.parametrize("impl", ["infer_ref", "transformers"])
@pytest.mark.parametrize("family", FAMILIES)
def test_fixture_golden(family: str, impl: str) -> None:
    report = golden.verify_file(_file(family), impl=impl, device="cpu")
    assert report.ok
    # Trained fixtures answer with clear margins: greedy reproduces every golden token.
    assert report.free_match == report.total_steps
    assert report.min_golden_margin > 1.0


def test_fixture_goldens_end_on_eos_and_record_the_chat_prompt() -> None:
    doc = golden.load_golden(_file("gemma3"))
    assert doc["sampling"]["stop_on_eos"] and doc["model"]["source"] == "checkpoint"
    for case in doc["cases"]:
        assert case["prompt_text"].startswith("<bos><start_of_turn>user\n")
        assert case["steps"][-1]["token"] in doc["sampling"]["eos_token_ids"]


def test_planted_sliding_window_bug_fails_the_tiny_gemma_golden() -> None:
    path = _file("gemma3")
    window = golden.load_golden(path)["model"]["hf_config"]["sliding_window"]
    with golden.planted_bug("sliding-window-decode-mask"), pytest.raises(golden.GoldenMismatch) as info:
        golden.verify_file(path, impl="infer_ref")
    message = str(info.value)
    assert message.startswith("golden mismatch:") and "golden top-k:" in message and "our top-k:" in message
    first = min(f.position for c in info.value.report.cases for f in c.failures)
    assert first > window  # only decode steps past the window can differ


def test_fixture_weights_are_checked_before_comparing(tmp_path: Path) -> None:
    doc = golden.load_golden(_file("llama"))
    doc["model"]["weights_digest"] = "1" * 64
    path = golden.dump_golden(doc, tmp_path / "llama.json")
    with pytest.raises(golden.GoldenMetadataMismatch, match="weights_digest"):
        golden.verify_file(path)
