"""The ``repro:`` line of an engine-tier failure, for an engine with no repro script of its own."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from infer_ref.conformance.engines.protocol import EngineRequest
from infer_ref.conformance.engines.repro import REPRO_DIR_ENV, write_repro
from infer_ref.conformance.engines.session import EngineTier


class _UsersEngine:
    """A user's engine handle: no ``repro_snippet()``."""

    name = "my-engine 0.1"


def test_a_factory_without_a_script_gets_the_pytest_command_that_selects_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Old: the line named only the test and the folder, so running it judged infer_ref's own engine.
    (tmp_path / "my_engine_pkg.py").write_text("def start(model_dir, options, *, threads=1):\n    raise NotImplementedError\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(REPRO_DIR_ENV, str(tmp_path / "repros"))
    tier = EngineTier(engine="my_engine_pkg:start", endpoint=None, dtype="bfloat16", engine_options=("threads=2",))
    folder = tmp_path / "checkpoints" / "llama tiny"
    line = write_repro(_UsersEngine(), "test_generated_logprobs_agree_with_oracle", folder,
                       [EngineRequest((1, 2, 3), 4)], [[[0]]], "1 of 1 requests disagree", 0.3, tier.selects())  # fmt: skip
    assert line.startswith("repro: pytest --pyargs infer_ref.conformance.engines.tests ")
    words = shlex.split(line.removeprefix("repro: "))
    assert "--ir-engine=my_engine_pkg:start" in words and "--ir-engine-dtype=bfloat16" in words
    assert "--ir-engine-option=threads=2" in words and f"--ir-model-dir={folder}" in words
    assert words[words.index("-k") + 1] == "test_generated_logprobs_agree_with_oracle"
    assert not (tmp_path / "repros").exists()  # no script written


def test_an_endpoint_is_selected_by_its_url() -> None:
    tier = EngineTier(engine=None, endpoint="http://127.0.0.1:8000/v1", dtype="float32")
    assert tier.selects() == "--ir-endpoint=http://127.0.0.1:8000/v1"
