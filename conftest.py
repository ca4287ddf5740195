"""Root test configuration: markers, the ``device`` fixture, Hypothesis profiles, GPU skipping."""

from __future__ import annotations

import os
from importlib.metadata import entry_points

import pytest
import torch

# The conformance plugin (--ir-impl, --ir-xfails, capability skips, report header) is registered
# through the ``pytest11`` entry point when infer_ref is installed; load it here when it is not.
# It also registers the Hypothesis profiles (infer_ref/conformance/profiles.py): ``ci`` extends the
# built-in one (derandomized, no deadline); ``dev`` is a quick local loop; ``nightly`` searches much
# harder. Pick with --hypothesis-profile=NAME or INFER_REF_HYPOTHESIS_PROFILE=NAME; CI=true selects ``ci``.
# Any installed ``infer_ref`` entry point counts (an install made before the kit moved names the
# plugin by its old path, which still imports): registering it twice would be an error.
_PLUGIN = "infer_ref.conformance.plugin"
if not any(ep.name == "infer_ref" for ep in entry_points(group="pytest11")):
    pytest_plugins = [_PLUGIN]


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
