"""Fixtures of the engine tier: the tier (engines started once, stopped at the end), the checkpoint
folders (one test per folder), and capability skips (``@pytest.mark.ir_engine_requires(...)``)."""

from __future__ import annotations

import inspect
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from infer_ref.conformance.engines.protocol import EngineHandle
from infer_ref.conformance.engines.session import EngineCrash, EngineSession, EngineStartError
from infer_ref.conformance.engines.settings import TierSettings
from infer_ref.conformance.engines.tests.scenarios import Started
from infer_ref.conformance.engines.workloads.folders import default_model_dirs
from infer_ref.conformance.profiles import one_torch_thread
from infer_ref.conformance.report import NOT_JUDGED

_SESSION: dict[str, EngineSession] = {}


def _session(config: pytest.Config) -> EngineSession:
    if "session" not in _SESSION:
        settings = TierSettings.of(config)
        if settings.endpoint and len(settings.model_dirs) != 1:
            raise pytest.UsageError(
                "--ir-endpoint needs exactly one --ir-model-dir: the folder the server serves"
            )
        _SESSION["session"] = EngineSession(settings)
    return _SESSION["session"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "ir_engine_requires(*capabilities): skip unless the engine declares them"
    )
    config.addinivalue_line(
        "markers", "ir_long_context: the long-context workload (run with --ir-long-context, and only then)"
    )
    config.addinivalue_line(
        "markers",
        "ir_numerics: runs on the numerics checkpoints of the dtype (bfloat16, float16), not the default "
        "ones",
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "model_dir" in metafunc.fixturenames:
        settings = TierSettings.of(metafunc.config)
        if metafunc.definition.get_closest_marker("ir_numerics") is not None:
            dirs = _numerics_dirs(settings)
            if not dirs:  # one skipped test saying why, rather than an empty parameter set
                why = "no numerics checkpoint in this dtype, or --ir-model-dir names the folders to judge"
                none = pytest.param(Path("no-numerics-checkpoint"), marks=pytest.mark.skip(reason=why))
                metafunc.parametrize("model_dir", [none], ids=["no-numerics-checkpoint"], scope="session")
                return
        else:
            dirs = list(settings.model_dirs) or _default_dirs(settings.long_context)
        metafunc.parametrize("model_dir", dirs, ids=[d.name for d in dirs], scope="session")


def _numerics_dirs(settings: TierSettings) -> list[Path]:
    """The numerics checkpoints of the run's dtype and workload (none in float32/float64, or for a
    team's own folders)."""
    if settings.model_dirs:
        return []
    from infer_ref.conformance.engines.numerics_workload import numerics_model_dirs

    return numerics_model_dirs(settings.dtype, long_context=settings.long_context)


def _default_dirs(long_context: bool) -> list[Path]:
    key = "long" if long_context else "default"
    if key not in _DIRS:  # written once per process (cached on disk across runs)
        _DIRS[key] = default_model_dirs(long_context=long_context)
        if not _DIRS[key]:
            raise pytest.UsageError(
                "no checkpoints to judge: pass --ir-model-dir DIR (the kit's own need a checkout of "
                "infer_ref)"
            )
    return _DIRS[key]


_DIRS: dict[str, list[Path]] = {}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    try:
        engines = _session(config)
    except EngineStartError as e:
        raise pytest.UsageError(str(e)) from None
    for item in items:
        if "model_dir" not in getattr(item, "fixturenames", ()):
            continue  # not an engine-tier test
        needed = [c for m in item.iter_markers("ir_engine_requires") for c in m.args]
        _record(item, needed)
        missing = [c for c in needed if c not in engines.capabilities]
        if missing:
            item.add_marker(
                pytest.mark.skip(reason=f"not supported by {engines.name} ({', '.join(missing)})")
            )


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makeitem(collector: pytest.Collector, name: str, obj: object) -> list[pytest.Item] | None:
    """``--ir-long-context`` runs the long-context tests alone; without it they are not collected.
    Not deselected: they are another workload, and pytest's "N deselected" in every run's header
    read as tests left out of this one."""
    if not (isinstance(collector, (pytest.Module, pytest.Class)) and inspect.isfunction(obj)):
        return None
    if not collector.funcnamefilter(name):
        return None
    if "model_dir" not in inspect.signature(obj).parameters:
        return None  # not an engine-tier test
    marks = getattr(obj, "pytestmark", [])
    module_marks = getattr(getattr(collector, "module", None), "pytestmark", [])
    every = [*marks, *(module_marks if isinstance(module_marks, list) else [module_marks])]
    long_test = any(mark.name == "ir_long_context" for mark in every)
    return [] if long_test != TierSettings.of(collector.config).long_context else None


def _record(item: pytest.Item, needed: list[str]) -> None:
    """What the conformance report tallies: capabilities, bug classes, oracle, checkpoint."""
    from infer_ref.conformance.engines.mutants import (
        ENGINE_BUG_CLASSES,
        LONG_CONTEXT_BUG_CLASSES,
        RECIPE_BUG_CLASSES,
    )
    from infer_ref.conformance.mutants import ALL_BUG_CLASSES
    from infer_ref.conformance.report import bug_classes_of

    item.user_properties.append(("ir_capabilities", sorted(set(needed)) or ["(any engine)"]))
    item.user_properties.append(
        (
            "ir_bug_classes",
            bug_classes_of(
                item, ALL_BUG_CLASSES + ENGINE_BUG_CLASSES + LONG_CONTEXT_BUG_CLASSES + RECIPE_BUG_CLASSES
            ),
        )
    )
    oracle = item.get_closest_marker("ir_oracle")
    if oracle is not None:
        item.user_properties.append(("ir_oracle", str(oracle.args[0])))
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "model_dir" in callspec.params:
        item.user_properties.append(("ir_family", Path(callspec.params["model_dir"]).name))


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """What this process's tier learnt, for the report's notes (before it is written): into the report
    where this process writes it, else handed to the xdist controller that does (``notes.py``)."""
    from infer_ref.conformance.engines.notes import STATE_KEY, tier_state, write_notes

    engines = _SESSION.get("session")
    if engines is None:
        return
    state = tier_state(engines.settings, engines.ledger, engines.factory_kwargs)
    if hasattr(session.config, "workerinput"):
        session.config.workeroutput[STATE_KEY] = state  # type: ignore[attr-defined]
        return
    collector = session.config.pluginmanager.get_plugin("infer_ref_report")
    if collector is not None:
        write_notes(collector.report, [state])


@pytest.fixture(scope="session")
def engines(request: pytest.FixtureRequest) -> Iterator[EngineSession]:
    """The run's engines (:class:`~infer_ref.conformance.engines.session.EngineSession`): its
    settings, its ledger, and the engines it starts, stopped at the end."""
    session = _session(request.config)
    yield session
    session.stop_all()


@pytest.fixture(autouse=True, scope="session")
def _one_thread() -> Iterator[None]:
    """The kit's checkpoints are tiny: one intra-op thread (the oracle and in-process engines)."""
    yield from one_torch_thread()


@pytest.fixture
def started(engines: EngineSession, request: pytest.FixtureRequest) -> Started:
    """``started(model_dir, kind)``: the engine (one that cannot start makes the test "not judged").

    Capabilities may be declared per started engine: a handle whose own ``capabilities`` lack one
    the test needs (``ir_engine_requires``) makes the test "not supported", as the factory's
    declaration does before any start (an engine option, or what a server turns out to offer, can
    narrow what a start honours)."""
    needed = [c for m in request.node.iter_markers("ir_engine_requires") for c in m.args]

    def get(model_dir: Path, kind: str = "stressed") -> EngineHandle:
        handle = engines.handle(model_dir, kind)
        missing = [c for c in needed if c not in getattr(handle, "capabilities", frozenset(needed))]
        if missing:
            pytest.skip(f"not supported by {handle.name} ({', '.join(missing)}: not declared by this start)")
        return handle

    return get


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed engine-tier test's message, for the report's one line per failure and its blame
    (``infer_ref.conformance.engines.blame``): pytest's own text of it holds the kit's traceback."""
    report: pytest.TestReport = yield
    if report.failed and call.excinfo is not None and "model_dir" in getattr(item, "fixturenames", ()):
        report.user_properties.append(("ir_failure", str(call.excinfo.value)[:4000]))
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    return (yield from _judged_only(item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    return (yield from _judged_only(item))


def _judged_only(item: pytest.Item) -> Iterator[None]:
    """An engine that could not be started or reached, wherever a test meets it, makes the test
    "not judged" with the reason, never failed: nothing about the engine was learnt (a closed port
    is not a wrong answer). The report's verdict is then "nothing judged" and the exit status 7.
    An engine that raised while answering fails the test, with a repro script like any failure."""
    try:
        return (yield)
    except EngineStartError as e:
        pytest.skip(f"{NOT_JUDGED} {e}")
    except EngineCrash as crash:
        raise AssertionError(_crash_message(item, crash)) from crash.error


def _crash_message(item: pytest.Item, crash: EngineCrash) -> str:
    """The crash, and the repro of the call that raised (the script sends its requests in one call)."""
    from infer_ref.conformance.engines.verdicts.repro import Replay, write_repro

    assert isinstance(item, pytest.Function)  # an engine test, parametrized by its checkpoint folder
    engines, model_dir = _session(item.config), Path(str(item.callspec.params["model_dir"]))
    case = engines.case(item.originalname, model_dir, crash.handle, engines.kind_of(crash.handle))
    replay = Replay(crash.requests, [[list(range(len(crash.requests)))]], engines.settings.oracle_tolerance())
    return f"{crash}\n{write_repro(case, replay, str(crash))}"
