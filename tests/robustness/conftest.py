"""The bad-input suite: shared tiny models and snapshot copies, one intra-op thread.

Every test here feeds one bad input and asserts three things: the error type, that the message
names the culprit (the field, argument or file and the bad value), and, for stateful objects,
that nothing changed. Test ids start with their area (``config-``, ``loader-``, ...) so that
``pytest tests/robustness --collect-only -q`` shows the count per area.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from infer_ref.config import ModelConfig
from infer_ref.conformance.profiles import one_torch_thread
from infer_ref.loader import load_model
from infer_ref.models import DecoderLM
from infer_ref.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "fixtures" / "checkpoints"
LLAMA = FIXTURES / "llama-tiny"


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    yield from one_torch_thread()


@pytest.fixture(scope="session")
def llama() -> tuple[DecoderLM, ModelConfig]:
    return load_model(LLAMA, dtype=torch.float32, device="cpu")


@pytest.fixture(scope="session")
def llama_tokenizer() -> Tokenizer:
    return Tokenizer(LLAMA)


@pytest.fixture
def snapshot(tmp_path: Path) -> Path:
    """A private copy of the llama-tiny snapshot, free to break."""
    return Path(shutil.copytree(LLAMA, tmp_path / "llama-tiny"))
