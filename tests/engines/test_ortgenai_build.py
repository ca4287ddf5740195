"""ONNX Runtime GenAI's model builder as the adapter runs it, without the engine: a stand-in builder
package answers as the real one does, so the cache, the refusal ("not supported", in the builder's
words), a builder that fails, and each user mistake get their one clear error."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from infer_ref.conformance.engines.adapters.engine_venv import worker_env
from infer_ref.conformance.engines.adapters.ortgenai import PYTHON_ENV, start_ortgenai
from infer_ref.conformance.engines.adapters.ortgenai_build import build, build_error
from infer_ref.conformance.engines.adapters.subprocess_bridge import EngineNotInstalled
from infer_ref.conformance.engines.protocol import EngineOptions
from infer_ref.conformance.interface.contract import Unsupported
from infer_ref.errors import DataError

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "checkpoints"

# A stand-in onnxruntime_genai.models.builder: refuses as the real one does when REFUSE is set,
# crashes when CRASH is set, else writes a genai_config.json naming its -p into -o.
FAKE_BUILDER = '''
import argparse, json, os, pathlib

parser = argparse.ArgumentParser()
for flag in ("-i", "-o", "-p", "-e", "-c"):
    parser.add_argument(flag)
args = parser.parse_args()
if os.environ.get("REFUSE"):
    raise NotImplementedError(f"The {args.i} model is not currently supported.")
if os.environ.get("CRASH"):
    raise KeyError("rope_type")
out = pathlib.Path(args.o)
out.mkdir(parents=True)
(out / "genai_config.json").write_text(json.dumps({"precision": args.p, "ep": args.e}))
with open(os.environ["BUILDS_LOG"], "a") as log:
    log.write("built\\n")
'''


@pytest.fixture
def fake_env(tmp_path: Path) -> dict[str, str]:
    """An environment whose python finds the stand-in builder (and its version through a dist-info)."""
    site = tmp_path / "site"
    (site / "onnxruntime_genai" / "models").mkdir(parents=True)
    (site / "onnxruntime_genai" / "__init__.py").write_text("")
    (site / "onnxruntime_genai" / "models" / "__init__.py").write_text("")
    (site / "onnxruntime_genai" / "models" / "builder.py").write_text(textwrap.dedent(FAKE_BUILDER))
    dist = site / "onnxruntime_genai-9.9.9.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: onnxruntime-genai\nVersion: 9.9.9\n")
    return {**worker_env(), "PYTHONPATH": str(site), "BUILDS_LOG": str(tmp_path / "builds.log")}


def _builds(env: dict[str, str]) -> int:
    log = Path(env["BUILDS_LOG"])
    return len(log.read_text().splitlines()) if log.is_file() else 0


def test_a_build_runs_the_builder_for_cpu_at_the_dtype_and_is_cached(fake_env: dict[str, str], tmp_path: Path) -> None:
    first = build(FIXTURES / "llama-tiny", "float32", python=sys.executable, env=fake_env, cache=tmp_path / "cache")
    assert (first.path / "genai_config.json").read_text() == '{"precision": "fp32", "ep": "cpu"}'
    assert (first.precision, first.builder_version, _builds(fake_env)) == ("fp32", "9.9.9", 1)
    again = build(FIXTURES / "llama-tiny", "float32", python=sys.executable, env=fake_env, cache=tmp_path / "cache")
    assert (again.path, again.seconds, _builds(fake_env)) == (first.path, 0.0, 1)
    half = build(FIXTURES / "llama-tiny", "float16", python=sys.executable, env=fake_env, cache=tmp_path / "cache")
    assert half.path != first.path and _builds(fake_env) == 2


def test_an_architecture_the_builder_refuses_is_not_supported_in_its_words(fake_env: dict[str, str], tmp_path: Path) -> None:
    with pytest.raises(Unsupported, match="is not currently supported") as info:
        build(FIXTURES / "qwen3-tiny", "float32", python=sys.executable, env={**fake_env, "REFUSE": "1"}, cache=tmp_path)
    assert "\n" not in str(info.value) and "model builder exited with status 1" in str(info.value)
    assert not list(tmp_path.glob("qwen3-tiny-*")), "a refused build left a folder in the cache"


def test_a_builder_that_crashes_is_a_data_error_naming_its_last_error_line(fake_env: dict[str, str], tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"KeyError: 'rope_type'") as info:
        build(FIXTURES / "gemma3-tiny", "float32", python=sys.executable, env={**fake_env, "CRASH": "1"}, cache=tmp_path)
    assert not isinstance(info.value, Unsupported) and "\n" not in str(info.value)
    # The second start of the same checkpoint gets the same error without running the builder again
    # (run again, this stand-in would now succeed).
    with pytest.raises(DataError, match=r"KeyError: 'rope_type'"):
        build(FIXTURES / "gemma3-tiny", "float32", python=sys.executable, env=fake_env, cache=tmp_path)
    assert _builds(fake_env) == 0


def test_float64_is_refused_before_the_builder_runs(fake_env: dict[str, str], tmp_path: Path) -> None:
    with pytest.raises(Unsupported, match="writes no float64 model"):
        build(FIXTURES / "llama-tiny", "float64", python=sys.executable, env=fake_env, cache=tmp_path)
    assert _builds(fake_env) == 0


def test_build_error_reads_the_last_error_line_of_a_traceback() -> None:
    log = "Traceback (most recent call last):\n  File x\n    raise NotImplementedError(...)\nNotImplementedError: The GPT2LMHeadModel model is not currently supported.\n"
    refused = build_error(Path("m"), "fp32", 1, log)
    assert isinstance(refused, Unsupported) and str(refused).endswith("The GPT2LMHeadModel model is not currently supported.")
    assert "timed out" in str(build_error(Path("m"), "fp32", None, ""))


def test_an_interpreter_without_the_engine_is_one_error_naming_the_variable(tmp_path: Path) -> None:
    with pytest.raises(EngineNotInstalled, match=PYTHON_ENV) as info:  # this interpreter has no onnxruntime-genai
        start_ortgenai(FIXTURES / "llama-tiny", EngineOptions(prefix_caching=False), python=sys.executable, cache=tmp_path)
    assert "\n" not in str(info.value) and "scripts/install_ortgenai.sh" in str(info.value)


def test_a_folder_without_config_json_is_refused_before_any_build(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no config.json"):
        start_ortgenai(tmp_path, EngineOptions(prefix_caching=False), python=sys.executable, cache=tmp_path)
