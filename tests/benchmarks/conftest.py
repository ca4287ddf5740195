"""pytest-benchmark setup: machine info that names the GPU and the versions, so that
``--benchmark-compare`` only lines up runs of the same hardware and software."""

from __future__ import annotations

import platform
from typing import Any

import pytest
import torch


def pytest_benchmark_update_machine_info(config: pytest.Config, machine_info: dict[str, Any]) -> None:
    try:
        import transformers

        tf_version: str | None = transformers.__version__
    except ImportError:
        tf_version = None
    cuda = torch.cuda.is_available()
    machine_info["gpu"] = torch.cuda.get_device_name(0) if cuda else None
    machine_info["gpu_count"] = torch.cuda.device_count() if cuda else 0
    machine_info["torch"] = torch.__version__
    machine_info["cuda"] = torch.version.cuda
    machine_info["cudnn"] = torch.backends.cudnn.version() if cuda else None
    machine_info["transformers"] = tf_version
    machine_info["torch_threads"] = torch.get_num_threads()
    machine_info["python_implementation_version"] = platform.python_version()
