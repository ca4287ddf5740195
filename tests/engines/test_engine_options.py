"""``--engine-option KEY=VALUE``: a factory's own keywords, parsed by their annotations and
checked before anything starts; a start receives them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from infer_ref.cli.conformance import check_engine_args, pytest_args
from infer_ref.cli.main import build_parser
from infer_ref.cli.options import UsageError
from infer_ref.conformance.engines.adapters.llamacpp import start_llamacpp
from infer_ref.conformance.engines.factory_options import (
    EngineOptionError,
    factory_keywords,
    parse_engine_options,
)
from infer_ref.conformance.engines.protocol import EngineHandle, EngineOptions
from infer_ref.conformance.engines.session import EngineSession, EngineStartError
from infer_ref.conformance.engines.settings import TierSettings

STARTED: list[dict[str, object]] = []


def recording_factory(model_dir: Path, options: EngineOptions, *, threads: int = 1, scale: float = 1.0,
                      flash: bool = False, kv_cache_type: str | None = None,
                      source: str | os.PathLike[str] | None = None) -> EngineHandle:  # fmt: skip
    STARTED.append({"threads": threads, "scale": scale, "flash": flash, "kv_cache_type": kv_cache_type, "source": source})
    raise RuntimeError("recorded")


def test_values_parse_as_their_annotations() -> None:
    given = ["threads=4", "scale=0.5", "flash=true", "kv_cache_type=float16", "source=/tmp/llama.cpp"]
    assert parse_engine_options(given, recording_factory, "fake") == {
        "threads": 4, "scale": 0.5, "flash": True, "kv_cache_type": "float16", "source": "/tmp/llama.cpp",
    }  # fmt: skip
    assert parse_engine_options(["kv_cache_type=none", "scale=2"], recording_factory, "fake") == {"kv_cache_type": None, "scale": 2.0}


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (["threads"], r"--engine-option 'threads': expected KEY=VALUE"),
        (["=4"], r"--engine-option '=4': expected KEY=VALUE"),
        (["thread=4"], r"--engine-option thread: fake's factory takes no such keyword \(it takes: flash, kv_cache_type, scale, source, threads\)"),
        (["options=x"], r"--engine-option options: fake's factory takes no such keyword"),
        (["threads=four"], r"--engine-option threads='four': expected int"),
        (["threads=2.5"], r"--engine-option threads='2.5': expected int"),
        (["scale=big"], r"--engine-option scale='big': expected float"),
        (["flash=yes"], r"--engine-option flash='yes': expected true or false"),
        (["threads=none"], r"--engine-option threads=none: threads \(int\) cannot be None"),
        (["threads=2", "threads=3"], r"--engine-option threads given twice"),
    ],
)
def test_a_bad_option_names_what_was_wrong(given: list[str], message: str) -> None:
    with pytest.raises(EngineOptionError, match=message):
        parse_engine_options(given, recording_factory, "fake")


def test_llamacpps_factory_offers_its_kv_cache_type_and_threads() -> None:
    takes = factory_keywords(start_llamacpp)
    assert {"kv_cache_type", "threads", "source", "python"} <= set(takes) and not {"model_dir", "options"} & set(takes)
    assert parse_engine_options(["kv_cache_type=float16", "threads=2"], start_llamacpp, "llama.cpp") == {
        "kv_cache_type": "float16", "threads": 2}  # fmt: skip


def test_llamacpp_refuses_a_kv_cache_type_that_names_no_dtype_before_converting(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"kv_cache_type 'q8': expected one of float32, bfloat16, float16, float64"):
        start_llamacpp(tmp_path, EngineOptions(), kv_cache_type="q8")


def test_the_tier_passes_the_options_to_every_start(tmp_path: Path) -> None:
    STARTED.clear()
    tier = EngineSession(TierSettings(engine=f"{__name__}:recording_factory", endpoint=None, dtype="float32",
                      engine_options=("threads=3", "kv_cache_type=bfloat16")))  # fmt: skip
    with pytest.raises(EngineStartError, match="RuntimeError: recorded"):
        tier.handle(tmp_path, "plain")
    assert STARTED == [{"threads": 3, "scale": 1.0, "flash": False, "kv_cache_type": "bfloat16", "source": None}]


def test_the_tier_refuses_a_bad_option_and_options_for_an_endpoint() -> None:
    with pytest.raises(EngineStartError, match="takes no such keyword"):
        EngineSession(TierSettings(engine=f"{__name__}:recording_factory", endpoint=None, dtype="float32", engine_options=("nope=1",)))
    with pytest.raises(EngineStartError, match="a running endpoint was started by you"):
        EngineSession(TierSettings(engine=None, endpoint="http://127.0.0.1:9/v1", dtype="float32", engine_options=("threads=1",)))


def test_the_cli_passes_each_option_to_pytest_and_needs_an_engine() -> None:
    parser = build_parser()
    args = parser.parse_args(["conformance", "--engine", "llama.cpp", "--engine-option", "kv_cache_type=float16",
                              "--engine-option", "threads=2"])  # fmt: skip
    check_engine_args(args)
    out = pytest_args(args, [])
    assert out.count("--ir-engine-option=kv_cache_type=float16") == 1 and "--ir-engine-option=threads=2" in out
    alone = parser.parse_args(["conformance", "--engine-option", "threads=2"])
    with pytest.raises(UsageError, match="--engine-option sets a keyword of an engine the tier starts: add --engine ENGINE"):
        check_engine_args(alone)
