"""Root test configuration: markers, the ``device`` fixture, Hypothesis profiles, GPU skipping; on a
machine without CUDA, the automatic device choice made to stand for a GPU machine's; and the check
that no test leaves process-wide torch state or the environment changed."""

from __future__ import annotations

import os
from collections.abc import Generator
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
import torch

from infer_ref.devices import AUTO_DEVICE_ENV

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


def pytest_configure(config: pytest.Config) -> None:
    # Without CUDA the package's automatic device choice (load_model, caches, generate without a
    # device) is the CPU, as the tests' own tensors are; on a GPU machine it is cuda and such a test
    # fails. Here it resolves to ``meta`` instead, so that test fails on every machine: a test pins
    # its device, or takes the ``device`` fixture (the devices present). Child processes inherit it.
    # INFER_REF_AUTO_DEVICE=cpu in the environment turns it off. Only for this repository's own
    # suite: the kit run from an editable install (tests outside the rootdir) loads this file too.
    if _own_suite(config) and not torch.cuda.is_available():
        os.environ.setdefault(AUTO_DEVICE_ENV, "meta")
    if _own_suite(config):
        _share_cores_between_workers()


def _share_cores_between_workers() -> None:
    """An xdist worker takes its share of the cores for torch's intra-op threads. Each process's default
    is every core, so ``-n auto`` on N cores ran N workers x N threads: on a 16-core GPU host that made
    the README's command several times slower (measured in commit ca1c01d's message).
    Set before the session starts, so the state guard below sees it as the worker's baseline."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers is None:
        return  # not an xdist worker: torch's own default
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    torch.set_num_threads(max(1, cores // int(workers)))


def _own_suite(config: pytest.Config) -> bool:
    """This repository's own suite: not the kit judging an implementation or an engine (run from the
    checkout too), whose state is that engine's business."""
    judging = any(
        config.getoption(option, default=None) for option in ("--ir-engine", "--ir-endpoint", "--ir-impl")
    )
    return config.rootpath == Path(__file__).resolve().parent and not judging


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


# Process-wide state a test can change for the tests after it in the same worker: a test that sets it
# must restore it (a fixture that yields, monkeypatch), or results depend on which worker ran what
# before. Checked after the last test of each module, once its module fixtures are torn down, against
# the state at the session's start; a change fails that test's teardown, naming what changed.
def _torch_state() -> dict[str, Any]:
    cuda, cudnn = torch.backends.cuda, torch.backends.cudnn
    return {
        "torch.get_default_dtype()": torch.get_default_dtype(),
        "torch.get_default_device()": torch.get_default_device(),
        "torch.get_num_threads()": torch.get_num_threads(),
        "torch.is_grad_enabled()": torch.is_grad_enabled(),
        "torch.is_inference_mode_enabled()": torch.is_inference_mode_enabled(),
        "torch.are_deterministic_algorithms_enabled()": torch.are_deterministic_algorithms_enabled(),
        "torch.is_deterministic_algorithms_warn_only_enabled()": torch.is_deterministic_algorithms_warn_only_enabled(),
        "torch.get_float32_matmul_precision()": torch.get_float32_matmul_precision(),
        "torch.is_anomaly_enabled()": torch.is_anomaly_enabled(),
        "torch.backends.cuda.matmul.allow_tf32": cuda.matmul.allow_tf32,
        "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction": cuda.matmul.allow_fp16_reduced_precision_reduction,
        "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction": cuda.matmul.allow_bf16_reduced_precision_reduction,
        "torch.backends.cuda sdp backends (flash, mem_efficient, math)": (
            cuda.flash_sdp_enabled(),
            cuda.mem_efficient_sdp_enabled(),
            cuda.math_sdp_enabled(),
        ),
        "torch.backends.cudnn (allow_tf32, deterministic, benchmark)": (
            cudnn.allow_tf32,
            cudnn.deterministic,
            cudnn.benchmark,
        ),
    }


# The environment variables the suite and the package read. Others are left out: libraries set
# theirs at first use for the rest of the process (Inductor's and Triton's caches, CUDA_HOME,
# CUBLAS_WORKSPACE_CONFIG at an import, ...).
_WATCHED_ENV = {"CI", "CUDA_VISIBLE_DEVICES", "TRITON_INTERPRET"}


def _watched(name: str) -> bool:
    return name.startswith("INFER_REF_") or name in _WATCHED_ENV


def _process_state() -> dict[str, Any]:
    env = {f"os.environ[{k!r}]": v for k, v in os.environ.items() if _watched(k)}
    return {**_torch_state(), **env}


def _changes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    return [f"{k}: {before.get(k, '<unset>')!r} -> {after.get(k, '<unset>')!r}"
            for k in sorted(before.keys() | after.keys()) if before.get(k, "<unset>") != after.get(k, "<unset>")]  # fmt: skip


_SESSION_STATE: dict[str, Any] = {}


def pytest_sessionstart(session: pytest.Session) -> None:
    _SESSION_STATE.update(_process_state())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    result = yield
    if not _own_suite(item.config):
        return result  # the kit run from an editable install: this file was loaded after the session began
    if nextitem is not None and nextitem.path == item.path:
        return result  # the module's fixtures are still up: they may hold state they restore at its end
    if changed := _changes(_SESSION_STATE, _process_state()):
        _SESSION_STATE.update(_process_state())  # reported once, by the test that changed it
        pytest.fail(
            f"process-wide state changed by a test of {item.path.name} (or a fixture of it) and not restored; "
            "set it in a fixture that restores it, or with monkeypatch:\n  " + "\n  ".join(changed),
            pytrace=False,
        )
    return result
