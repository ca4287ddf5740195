"""Root test configuration: markers, the ``device`` fixture, Hypothesis profiles, GPU skipping."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, settings

# Hypothesis profiles. ``ci`` extends the built-in one (derandomized, no deadline); ``dev`` is a
# quick local loop; ``nightly`` searches much harder. Pick with --hypothesis-profile=NAME or
# INFER_REF_HYPOTHESIS_PROFILE=NAME; CI=true selects ``ci``.
_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large]
settings.register_profile(
    "ci", parent=settings.get_profile("ci"), max_examples=25, deadline=None, suppress_health_check=_SLOW_OK
)
settings.register_profile("dev", max_examples=10, deadline=None, suppress_health_check=_SLOW_OK)
settings.register_profile("nightly", max_examples=500, deadline=None, suppress_health_check=_SLOW_OK)
settings.load_profile(os.environ.get("INFER_REF_HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device: run `pytest -m gpu` on a GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def device() -> str:
    """Where integration tests run: $INFER_REF_DEVICE, else cuda when present, else cpu."""
    return os.environ.get("INFER_REF_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
