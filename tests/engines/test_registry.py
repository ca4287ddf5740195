"""The engine registry: every record's files exist, so that adding an engine is its adapter, its
worker, its record, its expected-failures file and its install script (CONTRIBUTING.md, "Adding an
engine to the tier"), and everything that lists engines reads the records."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from infer_ref.conformance.engines.matrix.tier_runs import RUNS
from infer_ref.conformance.engines.registry import (
    ENGINES,
    RECORDS,
    EngineRecord,
    not_installed_message,
    record,
)
from infer_ref.conformance.engines.session import load_factory

ROOT = Path(__file__).resolve().parents[2]
ENGINES_DIR = ROOT / "infer_ref" / "conformance" / "engines"


def missing_files(engine: EngineRecord) -> list[str]:
    """The files ``engine``'s record names that are not there (empty: the record is whole)."""
    module = importlib.util.find_spec(engine.module_name)
    named = {
        "adapter": Path(module.origin) if module is not None and module.origin else ENGINES_DIR / "adapters" / "?",
        "worker": ENGINES_DIR / "workers" / engine.worker if engine.worker else None,
        "install script": ROOT / engine.install if engine.install else None,
        "xfails file": ROOT / "infer_ref" / "conformance" / "xfails" / engine.xfails if engine.xfails else None,
    }
    return [f"{what} {path}" for what, path in named.items() if path is not None and not path.is_file()]


@pytest.mark.parametrize("engine", RECORDS, ids=[r.name for r in RECORDS])
def test_every_file_a_record_names_exists(engine: EngineRecord) -> None:
    assert missing_files(engine) == []
    assert callable(load_factory(engine.name))


@pytest.mark.parametrize("engine", [r for r in RECORDS if r.python_env], ids=[r.name for r in RECORDS if r.python_env])
def test_an_engine_in_a_venv_has_all_a_venv_needs(engine: EngineRecord) -> None:
    """Its variable, what it imports, its install script, its worker, its expected failures, and
    the words of its not-installed message."""
    assert engine.module and engine.install and engine.worker and engine.xfails and engine.label and engine.needs
    message = not_installed_message(engine, "/venv/bin/python", "no module named x")
    assert message.startswith(f"{engine.label} is not installed in /venv/bin/python: no module named x; set {engine.python_env}")
    assert message.endswith(f"({engine.install} builds one)")


def test_the_check_names_a_missing_file() -> None:
    made_up = EngineRecord("nothing", "infer_ref.conformance.engines.adapters.no_such_adapter:start",
                           install="scripts/install_nothing.sh", worker="nothing_worker.py", xfails="nothing.txt")
    assert [entry.split()[0] for entry in missing_files(made_up)] == ["adapter", "worker", "install", "xfails"]


def test_the_registry_the_matrix_and_the_command_line_read_the_records() -> None:
    assert list(ENGINES) == [r.name for r in RECORDS] and len(set(ENGINES)) == len(RECORDS)
    assert {r.name for r in RECORDS if r.in_matrix} <= set(RUNS)
    assert RUNS["llama.cpp-float16"].engine == "llama.cpp" and RUNS["llama.cpp-float16"].dtype == "float16"
    with pytest.raises(KeyError, match="no engine 'nope' in the registry; known: infer_ref, transformers"):
        record("nope")
