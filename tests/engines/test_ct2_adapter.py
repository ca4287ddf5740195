"""CTranslate2's adapter without CTranslate2: its converter run as the adapter runs it (a stand-in
converter beside a stand-in interpreter), the cache, the converter's refusals, and one clear error
for each thing a user can get wrong (no venv, no ctranslate2, no converter, a folder that is no
checkpoint, a dtype CTranslate2 has not), and what the adapter declares it lacks."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

from infer_ref.conformance.engines.adapters.ct2 import PYTHON_ENV, start_ct2
from infer_ref.conformance.engines.adapters.ct2_convert import CONVERTER, convert
from infer_ref.conformance.engines.adapters.engine_venv import worker_env
from infer_ref.conformance.engines.adapters.subprocess_bridge import WORKERS_DIR, EngineNotInstalled
from infer_ref.conformance.engines.protocol import CAPABILITIES, EngineOptions
from infer_ref.conformance.engines.registry import ENGINES
from infer_ref.conformance.engines.session import load_factory
from infer_ref.conformance.interface.contract import Unsupported
from infer_ref.errors import DataError

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "checkpoints" / "llama-tiny"
OPTIONS = EngineOptions(dtype="float32", prefix_caching=False)

# A stand-in for ct2-transformers-converter: refuses or fails as $FAIL says, else writes model.bin
# (its arguments inside) and counts its runs in $RUNS.
FAKE_CONVERTER = f"""#!{sys.executable}
import argparse, os, pathlib, sys

parser = argparse.ArgumentParser()
parser.add_argument("--model")
parser.add_argument("--output_dir")
parser.add_argument("--quantization")
args = parser.parse_args()
with open(os.environ["RUNS"], "a") as runs:
    runs.write("run\\n")
if os.environ.get("FAIL"):
    print("Loading the model...")
    sys.exit(os.environ["FAIL"])
out = pathlib.Path(args.output_dir)
out.mkdir()
(out / "model.bin").write_text(args.quantization + " " + args.model)
"""


@pytest.fixture
def fake_venv(tmp_path: Path) -> Path:
    """A bin/ folder with a python (this one) and the stand-in converter beside it; returns the python."""
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").symlink_to(sys.executable)
    converter = bin_dir / CONVERTER
    converter.write_text(textwrap.dedent(FAKE_CONVERTER))
    converter.chmod(0o755)
    return bin_dir / "python"


def _convert(python: Path, tmp_path: Path, dtype: str = "float32", **env: str):  # type: ignore[no-untyped-def]
    runs = tmp_path / "runs.txt"
    return convert(FIXTURE, dtype, python=os.fspath(python), version="0.0-test", cache=tmp_path / "cache",
                   env={**worker_env(), "RUNS": os.fspath(runs), **env})  # fmt: skip


def _runs(tmp_path: Path) -> int:
    path = tmp_path / "runs.txt"
    return len(path.read_text().splitlines()) if path.is_file() else 0


def test_conversion_runs_the_converter_once_and_caches_its_output(fake_venv: Path, tmp_path: Path) -> None:
    first = _convert(fake_venv, tmp_path)
    assert (first.path / "model.bin").read_text() == f"float32 {FIXTURE.resolve()}"
    assert first.seconds > 0 and first.quantization == "float32"
    second = _convert(fake_venv, tmp_path)
    assert (second.path, second.seconds) == (first.path, 0.0)
    assert _runs(tmp_path) == 1
    float16 = _convert(fake_venv, tmp_path, "float16")
    assert float16.path != first.path and (float16.path / "model.bin").read_text().startswith("float16 ")
    assert _runs(tmp_path) == 2
    assert not list((tmp_path / "cache").glob(".converting-*")), "the converter's work folder is left behind"


def test_an_architecture_the_converter_refuses_is_not_supported_with_its_message(fake_venv: Path, tmp_path: Path) -> None:
    refusal = "ValueError: No conversion is registered for the model configuration FooConfig (supported configurations are: ...)"
    with pytest.raises(Unsupported, match="No conversion is registered for the model configuration FooConfig") as info:
        _convert(fake_venv, tmp_path, FAIL=refusal)
    assert "CTranslate2's converter exited with status 1" in str(info.value) and str(FIXTURE) in str(info.value)
    assert not list((tmp_path / "cache").iterdir()), "a refused conversion left something in the cache"


def test_any_other_converter_failure_is_a_data_error_with_its_last_error_line(fake_venv: Path, tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"--quantization float32\): OSError: model.safetensors is truncated"):
        _convert(fake_venv, tmp_path, FAIL="OSError: model.safetensors is truncated")


def test_float64_is_refused_before_any_conversion(fake_venv: Path, tmp_path: Path) -> None:
    with pytest.raises(Unsupported, match="CTranslate2 has no float64 compute type"):
        _convert(fake_venv, tmp_path, "float64")
    assert _runs(tmp_path) == 0


def test_a_folder_that_is_no_checkpoint_is_refused_before_anything_runs(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="is not a Hugging Face checkpoint folder"):
        start_ct2(tmp_path, OPTIONS, python=tmp_path / "no-python")


def test_a_missing_interpreter_names_the_variable_and_the_install_script(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "bin" / "python"
    with pytest.raises(EngineNotInstalled, match=f"cannot run it.*set {PYTHON_ENV}.*scripts/install_ct2.sh"):
        start_ct2(FIXTURE, OPTIONS, python=missing, cache=tmp_path / "cache")


def test_an_interpreter_without_ctranslate2_is_named(tmp_path: Path) -> None:
    # This interpreter (the kit's) has no ctranslate2: it never goes into the project's environment.
    with pytest.raises(EngineNotInstalled, match=f"CTranslate2 is not installed in .*: it has no ctranslate2 package; set {PYTHON_ENV}"):
        start_ct2(FIXTURE, OPTIONS, python=sys.executable, cache=tmp_path / "cache")


def test_ctranslate2_is_registered_and_declares_what_it_lacks() -> None:
    factory = load_factory("ctranslate2")
    assert factory is start_ct2 and ENGINES["ctranslate2"].endswith("adapters.ct2:start_ct2")
    declared = start_ct2.capabilities  # type: ignore[attr-defined]
    assert declared <= set(CAPABILITIES)
    # No prefix cache reused across calls, no chunked prefill, no KV budget, no stop strings, no
    # cached-token count: each property needing one is "not supported", never judged on a fake.
    assert not declared & {"prefix_caching", "reset_prefix_cache", "cached_tokens", "chunked_prefill", "kv_budget", "stop_strings"}
    worker_capabilities = _worker_capabilities()
    assert set(worker_capabilities) == declared, "the factory and its worker declare different capabilities"


def _worker_capabilities() -> tuple[str, ...]:
    """The worker's CAPABILITIES, read from its source (it imports worker_loop, a sibling, at import)."""
    namespace: dict[str, object] = {}
    source = (WORKERS_DIR / "ct2_worker.py").read_text()
    line = next(line for line in source.splitlines() if line.startswith("CAPABILITIES = "))
    exec(line, namespace)
    value = namespace["CAPABILITIES"]
    assert isinstance(value, tuple)
    return value


def test_installed_version_reads_the_interpreters_metadata_and_none_where_absent() -> None:
    import importlib.metadata
    import sys

    from infer_ref.conformance.engines.adapters.engine_venv import installed_version

    assert installed_version(sys.executable, "pytest") == importlib.metadata.version("pytest")
    assert installed_version(sys.executable, "no-such-package-xyz") is None
