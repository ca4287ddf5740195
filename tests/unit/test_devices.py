"""The one reading of user-given device names, and the runtime's rule: compute where the model is."""

from __future__ import annotations

import pytest
import torch

from infer_ref.devices import (
    AUTO_DEVICE_ENV,
    check_model_device,
    default_device,
    model_placement,
    resolve,
    resolve_device,
)
from infer_ref.errors import UsageError


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("warp9", "unknown device 'warp9': expected cpu, cuda or cuda:N"),
        ("mps", "unsupported device 'mps': expected cpu, cuda or cuda:N"),
        ("meta", "unsupported device 'meta'"),
    ],
)
def test_user_device_names_refused_with_what_is_expected(name: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        resolve_device(name)


def test_cuda_refused_on_a_machine_without_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(AUTO_DEVICE_ENV, raising=False)  # the automatic choice itself is checked here
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for name in ("cuda", "cuda:1"):
        with pytest.raises(UsageError, match=f"device '{name}' requested but CUDA is not available"):
            resolve_device(name)
    assert resolve_device(None) == torch.device("cpu")  # the default is never a device the machine lacks


def test_names_kept_as_spelled_and_allocation_devices_take_meta() -> None:
    assert resolve_device("cpu") == torch.device("cpu") and resolve_device(torch.device("cpu")) == torch.device("cpu")
    assert resolve("meta") == torch.device("meta")  # a cache sized without memory
    with pytest.raises(UsageError, match="unsupported device 'mps'"):
        resolve("mps")


def test_runtime_device_is_the_models() -> None:
    model = torch.nn.Linear(2, 2).to(torch.float64)
    assert model_placement(model) == (torch.device("cpu"), torch.float64)
    assert check_model_device(model, None) == torch.device("cpu")
    assert check_model_device(model, "cpu") == torch.device("cpu")
    with pytest.raises(UsageError, match=r"device='meta' but the model's parameters are on cpu.*move the model"):
        check_model_device(model, "meta")
    assert model.weight.device.type == "cpu"  # refused, not moved


def test_the_automatic_choice_can_be_made_to_stand_for_a_gpu_machines(monkeypatch: pytest.MonkeyPatch) -> None:
    """CI runs the default tier with INFER_REF_AUTO_DEVICE=meta: a test that leaves the device to the
    automatic choice then fails on a CPU as it would on a GPU machine (where the choice is cuda)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv(AUTO_DEVICE_ENV, "meta")
    assert default_device() == resolve_device(None) == torch.device("meta")
    assert resolve_device("cpu") == torch.device("cpu")  # a device named is never replaced
    monkeypatch.setenv(AUTO_DEVICE_ENV, "")
    assert default_device() == torch.device("cpu")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("warp9", "INFER_REF_AUTO_DEVICE='warp9': unknown device 'warp9'"),
        ("mps", "INFER_REF_AUTO_DEVICE='mps': unsupported device 'mps'"),
        ("cuda", "INFER_REF_AUTO_DEVICE='cuda': device 'cuda' requested but CUDA is not available"),
    ],
)
def test_a_bad_automatic_device_is_refused_naming_the_variable(
    value: str, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv(AUTO_DEVICE_ENV, value)
    with pytest.raises(UsageError, match=message):
        default_device()
