"""The worked example of docs/conformance.md, run as an implementer would run it.

``examples/naive_cache_adapter.py`` is an independent cache (a list of tensors per layer) with its
own mask and attention; ``infer-ref conformance`` runs the shipped tests against it from outside
the checkout, and this test checks the outcome and the report: header, and capabilities it lacks
reported as not supported.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conformance_run import conformance


@pytest.mark.kit_run
def test_suite_runs_against_the_example_adapter(tmp_path: Path) -> None:
    run = conformance("examples.naive_cache_adapter:ADAPTER", "-k", "not test_golden", cwd=tmp_path)
    assert run.returncode == 0, run.output[-4000:]
    assert "implementation examples.naive_cache_adapter:ADAPTER = naive-append-cache 1.0" in run.output, run.output[:2000]
    assert "hypothesis profile: dev" in run.output
    assert "not supported by naive-append-cache (rope: adapter has no rope_tables, apply_rope)" in run.output
    assert "not supported by naive-append-cache (cache.memory_bytes: its cache has no memory_bytes)" in run.output
    caps = run.report["by_capability"]
    for capability in ("cache", "mask", "attention", "model", "cache.errors"):
        assert caps[capability]["counts"]["passed"] > 0 and caps[capability]["counts"]["failed"] == 0, (capability, caps[capability])
