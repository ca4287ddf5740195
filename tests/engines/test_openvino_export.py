"""OpenVINO's export as the adapter runs it, without OpenVINO: optimum-cli's command line, the cache,
the retry with the older transformers where the exporter refuses the venv's, one clear error for
each thing a user can get wrong; and the worker's mapping of the tier's options and of echoed logprobs."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infer_ref.conformance.engines.adapters.engine_venv import worker_env
from infer_ref.conformance.engines.adapters.openvino import start_openvino
from infer_ref.conformance.engines.adapters.openvino_export import EXPORTED_FILES, export
from infer_ref.conformance.engines.adapters.subprocess_bridge import WORKERS_DIR, EngineNotInstalled
from infer_ref.conformance.engines.protocol import EngineOptions
from infer_ref.conformance.interface.contract import Unsupported
from infer_ref.errors import DataError

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "checkpoints"
# A stand-in optimum-cli: writes the files OpenVINO GenAI needs, each holding its command line and
# the PYTHONPATH it ran with; refuses as optimum-intel does when told to.
FAKE_CLI = '''#!{python}
import json, os, sys

args = sys.argv[1:]
out = args[-1]
older = os.environ.get("PYTHONPATH", "")
if os.environ.get("FAIL"):
    sys.exit("ValueError: " + os.environ["FAIL"])
if os.environ.get("TOO_NEW") and "export-transformers" not in older:
    sys.exit("ValueError: The current version of Transformers does not allow for the export of the model. "
             "Maximum required is 5.0, got: 5.5.4")
os.makedirs(out)
for name in {files!r}:
    with open(os.path.join(out, name), "w") as f:
        json.dump({{"argv": args[:-1], "pythonpath": older}}, f)
'''


@pytest.fixture
def fake_venv(tmp_path: Path) -> Path:
    """A venv's bin folder: its python (this one) and a stand-in optimum-cli beside it."""
    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").symlink_to(sys.executable)
    cli = bin_dir / "optimum-cli"
    cli.write_text(textwrap.dedent(FAKE_CLI.format(python=sys.executable, files=EXPORTED_FILES)))
    cli.chmod(0o755)
    return bin_dir / "python"


def _export(python: Path, cache: Path, **env: str):  # type: ignore[no-untyped-def]
    return export(FIXTURES / "llama-tiny", python=os.fspath(python), env={**worker_env(), **env}, cache=cache)


def _record(exported_path: Path) -> dict[str, Any]:
    return json.loads((exported_path / "openvino_model.xml").read_text())


def test_the_exporter_runs_as_its_command_line_documents_for_a_local_folder(fake_venv: Path, tmp_path: Path) -> None:
    exported = _export(fake_venv, tmp_path)
    assert _record(exported.path)["argv"] == [
        "export", "openvino", "--model", os.fspath((FIXTURES / "llama-tiny").resolve()),
        "--task", "text-generation-with-past", "--weight-format", "fp32",
    ]  # fmt: skip
    assert exported.export_path is None and exported.seconds > 0


def test_an_export_is_cached_by_content(fake_venv: Path, tmp_path: Path) -> None:
    first = _export(fake_venv, tmp_path)
    again = _export(fake_venv, tmp_path, FAIL="would fail if run")
    assert again.path == first.path and again.seconds == 0.0


def test_a_refused_transformers_is_retried_with_the_older_one(fake_venv: Path, tmp_path: Path) -> None:
    older = fake_venv.parent.parent / "src" / "export-transformers"
    (older / "transformers").mkdir(parents=True)
    exported = _export(fake_venv, tmp_path / "cache", TOO_NEW="1")
    assert exported.export_path == older and _record(exported.path)["pythonpath"] == os.fspath(older)


def test_a_refused_transformers_without_the_older_one_is_not_supported(fake_venv: Path, tmp_path: Path) -> None:
    with pytest.raises(Unsupported, match="Maximum required is 5.0") as info:
        _export(fake_venv, tmp_path, TOO_NEW="1")
    assert "\n" not in str(info.value)


def test_a_failing_export_is_one_line_and_caches_nothing(fake_venv: Path, tmp_path: Path) -> None:
    with pytest.raises(DataError, match="optimum-cli export openvino failed on .*ValueError: no such tensor") as info:
        _export(fake_venv, tmp_path / "cache", FAIL="no such tensor")
    assert "\n" not in str(info.value)
    assert not list((tmp_path / "cache").iterdir())


def test_an_interpreter_without_optimum_cli_is_one_error_naming_the_variable(tmp_path: Path) -> None:
    with pytest.raises(EngineNotInstalled, match="INFER_REF_OPENVINO_PYTHON") as info:
        start_openvino(FIXTURES / "llama-tiny", EngineOptions(), python=tmp_path / "bin" / "python", cache=tmp_path)
    assert "\n" not in str(info.value)


def test_float16_is_not_supported(fake_venv: Path, tmp_path: Path) -> None:
    with pytest.raises(Unsupported, match="float32 and bfloat16 .asked float16.: OpenVINO's CPU plugin computes float16 only"):
        start_openvino(FIXTURES / "llama-tiny", EngineOptions(dtype="float16"), python=fake_venv, cache=tmp_path)


# -- the worker's own logic (it imports only the standard library at module level) -----------------


@pytest.fixture
def worker() -> Iterator[Any]:
    sys.path.insert(0, os.fspath(WORKERS_DIR))
    try:
        import openvino_worker

        yield openvino_worker
    finally:
        sys.path.remove(os.fspath(WORKERS_DIR))


def test_the_tier_options_map_onto_the_scheduler(worker: Any) -> None:
    options = {"prefix_caching": True, "block_size": 32, "max_num_batched_tokens": 64, "kv_cache_tokens": 320,
               "max_num_seqs": None}  # fmt: skip
    assert worker.scheduler_settings(options) == {
        "enable_prefix_caching": True, "max_num_batched_tokens": 64, "dynamic_split_fuse": True,
        "num_kv_blocks": 10, "max_num_seqs": worker.DEFAULT_SEQS,
    }  # fmt: skip
    with pytest.raises(worker.Refused, match="blocks of 32 positions"):
        worker.scheduler_settings({**options, "block_size": 16})


def test_the_tier_dtype_is_asked_of_the_cpu_plugin_explicitly(worker: Any) -> None:
    assert worker.plugin_properties("float32") == {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}
    assert worker.plugin_properties("bfloat16") == {"INFERENCE_PRECISION_HINT": "bf16", "KV_CACHE_PRECISION": "bf16"}
    with pytest.raises(worker.Refused, match="float32 and bfloat16 .asked float16."):
        worker.plugin_properties("float16")


def test_echoed_logprobs_split_into_prompt_and_generated(worker: Any) -> None:
    prompt, generated = [5, 6, 7], [8, 9]
    ids, logprobs, entries = worker._split_echo(prompt, prompt + generated, [1.0, -0.5, -0.25, -0.125, -2.0])
    assert ids == generated and logprobs == [-0.125, -2.0]
    assert entries == [None, {"token": 6, "logprob": -0.5, "top": []}, {"token": 7, "logprob": -0.25, "top": []}]


def test_echo_missing_the_cached_positions_is_an_error(worker: Any) -> None:
    with pytest.raises(RuntimeError, match="echo returned 1 prompt logprobs for a 3-token prompt"):
        worker._split_echo([5, 6, 7], [5, 6, 7, 8, 9], [-0.25, -0.125, -2.0])
