"""The implementations a golden file is verified with: the built-in ones by name, any conformance
adapter as ``module:OBJECT``, each loaded on the file's model and turned into a session factory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from infer_ref.conformance.checkpoints.golden_names import IMPLEMENTATIONS
from infer_ref.conformance.oracles.golden import sessions
from infer_ref.conformance.oracles.golden.format import DTYPES
from infer_ref.conformance.oracles.golden.planted import planted_impl
from infer_ref.conformance.oracles.golden.sources import (
    ModelSource,
    load_infer_ref_model,
    load_transformers_model,
)


def adapter_model(adapter: Any, source: ModelSource, dtype: torch.dtype, device: str) -> Any:
    """``adapter.load_model`` on the golden file's model: its checkpoint folder, or the synthetic
    weights written once as an HF snapshot (``config.json`` + safetensors) in a temporary folder."""
    assert adapter.load_model is not None
    if source.source == "checkpoint":
        assert source.path is not None
        return adapter.load_model(source.path, dtype, device)
    import tempfile

    from infer_ref.conformance.checkpoints.snapshots import write_snapshot

    state = {name: t.to("cpu") for name, t in source.state(dtype, device).items()}  # generated on the device: fast
    with tempfile.TemporaryDirectory(prefix="infer_ref_golden_") as tmp:
        folder = write_snapshot(Path(tmp) / source.name, source.hf_config, state)
        del state
        return adapter.load_model(folder, dtype, device)


def sessions_for(impl: str, source: ModelSource, dtype: str, device: str) -> sessions.SessionFactory:
    """Load ``source`` with implementation ``impl`` (a built-in name or ``module:ADAPTER``) and
    return its session factory (inside :func:`planted_bug`, ``infer_ref`` is the planted mutant)."""
    torch_dtype = DTYPES[dtype]
    impl = planted_impl(impl)
    if ":" in impl:
        from infer_ref.conformance.interface.adapter import load_adapter

        adapter = load_adapter(impl)
        missing = [f for f in ("load_model", "make_model_cache", "forward") if getattr(adapter, f) is None]
        if missing:
            raise ValueError(f"--impl {impl}: adapter {adapter.name!r} has no {', '.join(missing)}; golden files need all three")
        return sessions.adapter_sessions(adapter, adapter_model(adapter, source, torch_dtype, device), device=device)
    if impl == "infer_ref":
        return sessions.infer_ref_sessions(load_infer_ref_model(source, torch_dtype, device), device=device)
    if impl == "transformers":
        return sessions.transformers_sessions(load_transformers_model(source, torch_dtype, device))
    if impl == "transformers-uncached":
        return sessions.transformers_uncached_sessions(load_transformers_model(source, torch_dtype, device))
    raise ValueError(f"unknown implementation {impl!r}; known: {', '.join(IMPLEMENTATIONS)}")


__all__ = ["IMPLEMENTATIONS", "adapter_model", "sessions_for"]
