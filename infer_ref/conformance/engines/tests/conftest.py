"""Fixtures of the engine tier: the tier (engines started once, stopped at the end), the checkpoint
folders (one test per folder), and capability skips (``@pytest.mark.ir_engine_requires(...)``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from infer_ref.conformance.engines.session import EngineStartError, EngineTier, default_model_dirs

_TIER: dict[str, EngineTier] = {}


def _tier(config: pytest.Config) -> EngineTier:
    if "tier" not in _TIER:
        _TIER["tier"] = EngineTier(
            engine=config.getoption("--ir-engine"),
            endpoint=config.getoption("--ir-endpoint"),
            dtype=config.getoption("--ir-engine-dtype"),
        )
    return _TIER["tier"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "ir_engine_requires(*capabilities): skip unless the engine declares them")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "model_dir" in metafunc.fixturenames:
        dirs = [Path(d) for d in metafunc.config.getoption("--ir-model-dir") or []] or default_model_dirs()
        metafunc.parametrize("model_dir", dirs, ids=[d.name for d in dirs], scope="session")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    try:
        tier = _tier(config)
    except EngineStartError as e:
        raise pytest.UsageError(str(e)) from None
    for item in items:
        needed = [c for m in item.iter_markers("ir_engine_requires") for c in m.args]
        missing = [c for c in needed if c not in tier.capabilities]
        if missing:
            item.add_marker(pytest.mark.skip(reason=f"not supported by {tier.name} ({', '.join(missing)})"))


@pytest.fixture(scope="session")
def tier(request: pytest.FixtureRequest) -> Iterator[EngineTier]:
    t = _tier(request.config)
    yield t
    t.stop_all()


@pytest.fixture(autouse=True, scope="session")
def _one_thread() -> Iterator[None]:
    """The kit's checkpoints are tiny: one intra-op thread (the oracle and in-process engines)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def started(tier: EngineTier):  # type: ignore[no-untyped-def]
    """``started(model_dir, kind)``: the engine, or the test fails with the start error in one line."""

    def get(model_dir: Path, kind: str = "stressed"):  # type: ignore[no-untyped-def]
        try:
            return tier.handle(model_dir, kind)
        except EngineStartError as e:
            pytest.fail(str(e), pytrace=False)

    return get
