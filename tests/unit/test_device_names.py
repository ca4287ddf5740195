"""Device names read without torch (``infer_ref.device_names``): the spelling a command line takes,
and whether the installed torch was built with a GPU backend, read from its ``version.py``."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from infer_ref import device_names
from infer_ref.device_names import check_device_name, no_cuda_message, torch_gpu_build
from infer_ref.errors import UsageError


@pytest.fixture(autouse=True)
def _fresh_reading() -> Iterator[None]:
    torch_gpu_build.cache_clear()
    yield
    torch_gpu_build.cache_clear()


def test_the_build_read_without_torch_is_the_one_torch_reports() -> None:
    assert torch_gpu_build() is bool(torch.version.cuda or torch.version.hip)


@pytest.mark.parametrize(("name", "kind"), [("cpu", "cpu"), ("cpu:0", "cpu"), ("cuda", "cuda"), ("cuda:0", "cuda"), ("cuda:12", "cuda")])
def test_device_names_of_the_two_kinds_are_read(name: str, kind: str) -> None:
    assert check_device_name(name) == kind
    assert torch.device(name).type == kind  # the same reading as torch's


@pytest.mark.parametrize("name", ["mps", "meta", "warp9", "CUDA", " cuda", "cuda:", "cuda:-1", "cuda:0:1", "cpu0", ""])
def test_other_names_are_refused_naming_the_name_and_what_is_expected(name: str) -> None:
    with pytest.raises(UsageError, match=rf"unsupported device {name!r}: expected cpu, cuda or cuda:N"):
        check_device_name(name)


def _torch_at(folder: Path, monkeypatch: pytest.MonkeyPatch, version_py: str | None) -> None:
    """Make ``find_spec("torch")`` find a stand-in package whose version.py holds ``version_py``."""
    package = folder / "torch"
    package.mkdir()
    (package / "__init__.py").write_text("", encoding="utf-8")
    if version_py is not None:
        (package / "version.py").write_text(version_py, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("torch", package / "__init__.py")
    monkeypatch.setattr(device_names.importlib.util, "find_spec", lambda name: spec)


@pytest.mark.parametrize(
    ("version_py", "expected"),
    [
        ("from typing import Optional\ncuda: Optional[str] = None\nhip: Optional[str] = None\n", False),
        ("from typing import Optional\ncuda: Optional[str] = '12.8'\nhip: Optional[str] = None\n", True),
        ("cuda = None\nhip = '6.2.41133'\n", True),
        ("cuda = None\n", None),  # hip not recorded: a layout the reading does not know
        ("cuda = get_cuda()\nhip = None\n", None),  # not a literal
        ("cuda = (\n", None),  # not Python
        (None, None),  # no version.py
    ],
    ids=["cpu-build", "cuda-build", "rocm-build", "hip-missing", "computed", "syntax-error", "no-file"],
)
def test_the_build_is_read_from_version_py_or_left_to_torch(
    version_py: str | None, expected: bool | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _torch_at(tmp_path, monkeypatch, version_py)
    assert torch_gpu_build() is expected


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_torch_refuses_cuda_in_the_words_read_without_it() -> None:
    from infer_ref.devices import resolve_device

    with pytest.raises(UsageError) as refused:
        resolve_device("cuda:0")
    assert str(refused.value) == no_cuda_message("cuda:0")
