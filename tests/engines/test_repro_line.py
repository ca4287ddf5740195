"""The ``repro:`` line of an engine-tier failure, for an engine with no repro script of its own."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from infer_ref.conformance.engines.adapters.infer_ref_engine import InferRefEngine
from infer_ref.conformance.engines.protocol import EngineOptions, EngineRequest
from infer_ref.conformance.engines.session import EngineSession
from infer_ref.conformance.engines.settings import TierSettings
from infer_ref.conformance.engines.verdicts.repro import REPRO_DIR_ENV, Case, Replay, write_repro

ROOT = Path(__file__).resolve().parents[2]
LLAMA = ROOT / "fixtures" / "checkpoints" / "llama-tiny"


class _UsersEngine:
    """A user's engine handle: no ``repro_snippet()``."""

    name = "my-engine 0.1"


def test_a_factory_without_a_script_gets_the_pytest_command_that_selects_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Old: the line named only the test and the folder, so running it judged infer_ref's own engine.
    (tmp_path / "my_engine_pkg.py").write_text("def start(model_dir, options, *, threads=1):\n    raise NotImplementedError\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(REPRO_DIR_ENV, str(tmp_path / "repros"))
    tier = EngineSession(TierSettings(engine="my_engine_pkg:start", endpoint=None, dtype="bfloat16", engine_options=("threads=2",)))
    folder = tmp_path / "checkpoints" / "llama tiny"
    case = Case("test_generated_logprobs_agree_with_oracle", folder, _UsersEngine(), tier.settings.selects())
    line = write_repro(case, Replay([EngineRequest((1, 2, 3), 4)], [[[0]]], 0.3), "1 of 1 requests disagree")
    assert line.startswith("repro: pytest --pyargs infer_ref.conformance.engines.tests ")
    words = shlex.split(line.removeprefix("repro: "))
    assert "--ir-engine=my_engine_pkg:start" in words and "--ir-engine-dtype=bfloat16" in words
    assert "--ir-engine-option=threads=2" in words and f"--ir-model-dir={folder}" in words
    assert words[words.index("-k") + 1] == "test_generated_logprobs_agree_with_oracle"
    assert not (tmp_path / "repros").exists()  # no script: nothing said how the engine was started


def test_an_endpoint_is_selected_by_its_url() -> None:
    tier = EngineSession(TierSettings(engine=None, endpoint="http://127.0.0.1:8000/v1", dtype="float32"))
    assert tier.settings.selects() == "--ir-endpoint=http://127.0.0.1:8000/v1"


class UnbrokenWithoutSnippet(InferRefEngine):
    """infer_ref's Engine as a user's factory would give it: no ``repro_snippet()`` of its own."""

    reproducible = False


def unbroken(model_dir: Path, options: EngineOptions) -> InferRefEngine:
    return UnbrokenWithoutSnippet(model_dir, options)


@pytest.mark.kit_run  # the script runs in a child process
@pytest.mark.parametrize(("engine", "status"), [
    ("infer_ref.conformance.engines.mutants:logprobs_shifted", 1),  # a planted bug: the script shows it
    (f"{__name__}:unbroken", 0),  # the control: the same script on a correct engine finds nothing
])  # fmt: skip
def test_any_factory_gets_a_script_that_starts_it_the_same_way(engine: str, status: int, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """Old: a user's factory got no repro script (the scripts needed an undocumented ``repro_snippet()``)."""
    monkeypatch.setenv(REPRO_DIR_ENV, str(tmp_path / "repros"))
    tier = EngineSession(TierSettings(engine=engine, endpoint=None, dtype="float32"))
    handle = tier.handle(LLAMA, "plain")
    requests = [EngineRequest((5, 9, 14, 3, 22, 7), 4), EngineRequest((8, 1, 30), 3)]
    case = tier.case("test_generated_logprobs_agree_with_oracle", LLAMA, handle, "plain")
    lines = write_repro(case, Replay(requests, [[[0, 1]]], 2e-4), "planted").splitlines()
    tier.stop_all()
    assert lines[0].startswith("repro: pytest --pyargs") and lines[-1].startswith("repro: python ")
    script = lines[-1].removeprefix("repro: python ")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(Path(__file__).parent)])}
    done = subprocess.run([sys.executable, script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == status, done.stdout[-2000:] + done.stderr[-2000:]
    last = done.stdout.strip().splitlines()[-1]
    assert last.endswith("disagreement(s)") and (last == "0 disagreement(s)") == (status == 0), done.stdout[-2000:]
