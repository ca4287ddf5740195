"""Golden token files, verified teacher-forced through the implementation's own cache and forward.

The files in ``fixtures/golden`` were written by transformers (the independent oracle). Each is
verified on the device type it was written on (``--device cuda`` for the ``cuda-bfloat16`` files,
the CPU for the ``cpu-float32`` ones) in the file's dtype: the prompt through ``make_model_cache``
+ ``forward``, then at every step the golden token; a step passes when the golden token is within
the dtype's ``eps`` of the best logprob and the golden top-k logprobs are within ``topk_atol``
(``infer_ref.conformance.oracles.golden``). A failure prints the golden report's per-step table. This is the question
engine teams ask of their bf16 CUDA kernels, asked of any adapter.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from infer_ref.conformance.oracles import golden
from infer_ref.conformance.plugin import current_impl_spec

pytestmark = [pytest.mark.ir_requires("golden"), pytest.mark.ir_oracle("golden files")]

GOLDEN_FILES = sorted(golden.GOLDEN_DIR.glob("*.json")) if golden.GOLDEN_DIR.is_dir() else []


def _device_type(path: Path) -> str:
    return path.name.rsplit(".", 2)[-2].split("-", 1)[0]  # name.<device>-<dtype>.json


@pytest.mark.skipif(not GOLDEN_FILES, reason=f"no golden files at {golden.GOLDEN_DIR} (they ship with a checkout of infer_ref)")
@pytest.mark.parametrize("path", GOLDEN_FILES, ids=[p.name.removesuffix(".json") for p in GOLDEN_FILES])
def test_golden_file_teacher_forced(ir_device: str, path: Path) -> None:
    """Every step of every case within the file's dtype tolerance, teacher-forced.

    Guards every bug class as it reaches tokens in the file's dtype and on its device, past the
    sliding window (the Gemma cases cross it), including *embed scale not rounded to dtype*.
    """
    wanted = _device_type(path)
    if torch.device(ir_device).type != wanted:
        pytest.skip(f"not supported on {ir_device}: a {wanted} golden file (run with --device {wanted})")
    report = golden.verify_file(path, impl=current_impl_spec(), device=ir_device, raise_on_failure=False)
    if not report.ok:
        raise AssertionError(golden.format_failure(report))
