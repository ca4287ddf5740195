"""Drawn model cases -> snapshot folders -> models of the implementation under test (memoised).

A property draws a :class:`~infer_ref.conformance.strategies.ModelCase`; this module writes its random
weights once per process as an HF snapshot (float32 safetensors, like a real checkpoint), loads it
through the adapter in the requested dtype, and keeps the weights for the transformers oracle.
"""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from infer_ref.conformance.checkpoints.snapshots import random_state_dict, write_snapshot
from infer_ref.conformance.interface.adapter import Adapter
from infer_ref.conformance.strategies import ModelCase

_ROOT: Path | None = None
_SNAPSHOTS: dict[str, tuple[Path, dict[str, Tensor]]] = {}
_MODELS: OrderedDict[tuple[str, str, str, str], Any] = OrderedDict()
_MAX_MODELS = 24


def case_key(case: ModelCase) -> str:
    return json.dumps({"config": case.hf_config, "seed": case.seed}, sort_keys=True)


def _root() -> Path:
    global _ROOT
    if _ROOT is None:
        _ROOT = Path(tempfile.mkdtemp(prefix="infer_ref_snapshots_"))
        atexit.register(shutil.rmtree, _ROOT, ignore_errors=True)
    return _ROOT


def snapshot(case: ModelCase) -> tuple[Path, dict[str, Tensor]]:
    """The snapshot folder of ``case`` and its float32 HF-named weights."""
    key = case_key(case)
    if key not in _SNAPSHOTS:
        state = random_state_dict(case.hf_config, case.seed)
        folder = write_snapshot(_root() / f"case{len(_SNAPSHOTS)}", case.hf_config, state)
        _SNAPSHOTS[key] = (folder, state)
    return _SNAPSHOTS[key]


def write_custom_snapshot(name: str, hf_config: dict[str, Any], state: dict[str, Tensor]) -> Path:
    """A hand-built checkpoint (fixed weights chosen to isolate one computation)."""
    return write_snapshot(_root() / name, hf_config, state)


def load(adapter: Adapter, case: ModelCase, dtype: torch.dtype = torch.float64, device: str = "cpu") -> Any:
    """``adapter.load_model`` on the snapshot of ``case`` (memoised per adapter, case, dtype, device)."""
    assert adapter.load_model is not None
    key = (adapter.name, case_key(case), str(dtype), device)
    if key in _MODELS:
        _MODELS.move_to_end(key)
        return _MODELS[key]
    folder, _ = snapshot(case)
    model = adapter.load_model(folder, dtype, device)
    _MODELS[key] = model
    while len(_MODELS) > _MAX_MODELS:
        _MODELS.popitem(last=False)
    return model
