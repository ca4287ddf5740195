"""CUDA golden files (bfloat16): the fixture checkpoints and the real-shape synthetic models.

Run with ``pytest -m gpu tests/golden`` on a CUDA machine; ``scripts/gpu_goldens.sh`` regenerates
the files first and writes docs/golden_report.md. The real-shape models (Llama-3.2-1B,
Qwen3-1.7B and gemma-3-1b-it shapes) are generated from their seed on the GPU; their weights
digest is checked against the file before anything is compared.

``INFER_REF_GOLDEN_DIR`` points at another folder of golden files; ``INFER_REF_GOLDEN_SYNTHETIC``
(space-separated) names other synthetic models, the last being the Gemma one;
``INFER_REF_GOLDEN_RESULTS`` names a JSON-lines file the results are appended to (the report
command reuses them).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch

from infer_ref.conformance.oracles import golden

pytest.importorskip("transformers")
pytestmark = pytest.mark.gpu

DIR = Path(os.environ.get("INFER_REF_GOLDEN_DIR") or golden.GOLDEN_DIR)
SYNTHETIC = tuple(os.environ.get("INFER_REF_GOLDEN_SYNTHETIC", "llama-3.2-1b qwen3-1.7b gemma-3-1b-it").split())
FIXTURES = ("llama-tiny", "qwen3-tiny", "gemma3-tiny")
GEMMA = SYNTHETIC[-1]


def _record(entry: dict[str, object]) -> None:
    target = os.environ.get("INFER_REF_GOLDEN_RESULTS")
    if target:
        with open(target, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(entry, default=str) + "\n")


def _file(name: str) -> Path:
    path = DIR / f"{name}.cuda-bfloat16.json"
    if not path.is_file():
        pytest.fail(f"{path} is missing: run scripts/gpu_goldens.sh on a CUDA machine")
    return path


@pytest.mark.parametrize("impl", ["infer_ref", "transformers"])
@pytest.mark.parametrize("name", FIXTURES + SYNTHETIC)
def test_cuda_golden(name: str, impl: str) -> None:
    t0 = time.perf_counter()
    path = _file(name)
    report = golden.verify_file(path, impl=impl, device="cuda", raise_on_failure=False)
    _record({"file": str(path), "impl": impl, "report": report.to_dict(), "seconds": time.perf_counter() - t0})
    print(report.summary())
    report.raise_for_failures()
    assert report.ok
    if name in FIXTURES:
        assert report.free_match == report.total_steps  # trained: clear margins even in bf16


def test_planted_sliding_window_bug_fails_the_real_shape_gemma_golden() -> None:
    path = _file(GEMMA)
    window = golden.load_golden(path)["model"]["hf_config"]["sliding_window"]
    with golden.planted_bug("sliding-window-decode-mask"), pytest.raises(golden.GoldenMismatch) as info:
        golden.verify_file(path, impl="infer_ref", device="cuda")
    print(info.value)
    _record({"planted_bug": "sliding-window-decode-mask", "file": str(path), "code": 1, "message": str(info.value)})
    assert str(info.value).startswith("golden mismatch:")
    positions = [f.position for c in info.value.report.cases for f in c.failures]
    assert min(positions) > window
    # Both prompts fail: the one crossing the window in prefill and the one crossing it in decode.
    assert all(c.failures for c in info.value.report.cases)


def test_synthetic_weights_are_the_same_bits_on_cuda_and_cpu() -> None:
    spec = golden.SYNTHETIC_MODELS["gemma3-standin"]
    cpu = golden.synthetic_state_dict(spec.hf_config, 0, spec.init, dtype=torch.bfloat16, device="cpu")
    cuda = golden.synthetic_state_dict(spec.hf_config, 0, spec.init, dtype=torch.bfloat16, device="cuda")
    assert golden.weights_digest(cpu) == golden.weights_digest(cuda)
