"""Property tier settings: one intra-op thread per process.

The models here are tiny (hidden 32-64): with several threads each matmul spends more time in
thread hand-off than in arithmetic, and ``pytest -n auto`` already runs one process per core.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from infer_ref.conformance.profiles import one_torch_thread


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    yield from one_torch_thread()
