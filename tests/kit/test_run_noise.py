"""What a newcomer reads as trouble and is not: a conformance run prints no warning of the kit's own
making (transformers' FutureWarning for the ``past_key_values`` keyword, 50 of them in one run of the
transformers adapter; pytest's "Unknown pytest.mark.gpu" outside a checkout) and no pytest-benchmark
header line."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from infer_ref.conformance.oracles.transformers_cache import forward_with_cache

ROOT = Path(__file__).resolve().parents[2]
LLAMA = ROOT / "fixtures" / "checkpoints" / "llama-tiny"


def test_a_cached_transformers_forward_warns_nothing_and_gives_the_uncached_logits() -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(LLAMA, dtype=torch.float64).eval()
    ids = torch.tensor([[1, 5, 9, 2, 7]])
    with warnings.catch_warnings(record=True) as raised, torch.no_grad():
        warnings.simplefilter("always")
        prefill, cache = forward_with_cache(model, None, input_ids=ids[:, :4], use_cache=True)
        step, _ = forward_with_cache(model, cache, input_ids=ids[:, 4:], use_cache=True)
        full = model(input_ids=ids, use_cache=False).logits  # the oracle: no cache at all
    assert [str(w.message) for w in raised if issubclass(w.category, (FutureWarning, DeprecationWarning))] == []
    assert cache is not None
    # float64 on 5 positions: the cached and uncached paths agree to rounding (measured: 0.0 here; the
    # step run without the cache is off by 0.52)
    torch.testing.assert_close(prefill.logits[0], full[0, :4], rtol=0, atol=1e-12)
    torch.testing.assert_close(step.logits[0, -1], full[0, 4], rtol=0, atol=1e-12)


@pytest.mark.kit_run
def test_a_conformance_run_of_the_transformers_adapter_prints_no_warning_and_no_benchmark_header(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "INFER_REF_MODELS": ""}
    run = subprocess.run(
        [sys.executable, "-m", "infer_ref.cli", "conformance", "--impl", "infer_ref.conformance.adapters.transformers:DYNAMIC_SDPA",
         "-k", "test_model"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-3000:]
    last = out.strip().splitlines()[-1]
    assert " passed" in last and "warning" not in last, last
    assert "Warning" not in out and not any(line.startswith("benchmark:") for line in out.splitlines()), out[:3000]
