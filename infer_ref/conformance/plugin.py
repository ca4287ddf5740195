"""pytest plugin of the conformance suite (registered as the ``infer_ref`` pytest11 entry point).

* ``--ir-impl=module:object`` (or ``$INFER_REF_IMPL``) selects the implementation under test, an
  :class:`~infer_ref.conformance.interface.adapter.Adapter`; default: infer_ref itself.
* Its capabilities are probed once; a test marked ``@pytest.mark.ir_requires("cache", ...)`` is
  skipped as "not supported by <name>" when the adapter lacks one of them.
* ``--ir-device`` / ``--ir-dtype`` (default cpu / float64) reach every adapter call that takes a
  device or a dtype. Under pytest-xdist with a CUDA device, each worker takes its own GPU
  (round-robin over the visible devices): ``-n 8`` on an 8-GPU runner uses all eight.
* ``--ir-xfails FILE`` marks tests as strict expected failures: one test-id prefix per line
  (``infer_ref/conformance/tests/test_cache.py::test_reset`` or ``test_cache.py::test_reset``),
  ``#`` comments. Stale entries fail the run: an entry matching no test, or a listed test that passes.
* :class:`~infer_ref.conformance.interface.contract.Unsupported` raised by the adapter skips a fixed test (a
  property rejects the draw instead); the report counts both.
* The report header names the implementation, versions, device, dtype and Hypothesis profile; the
  conformance report (:mod:`infer_ref.conformance.report`) closes the run, ``--ir-report FILE.md|json``
  writes it.
* Fixtures: ``ir_adapter`` (the Adapter), ``ir_device``, ``ir_dtype``.
"""

from __future__ import annotations

import os
import platform
import warnings
from collections.abc import Generator
from pathlib import Path

import pytest
import torch

from infer_ref.conformance import report as ir_report
from infer_ref.conformance.assertions import NOTES, set_run_context
from infer_ref.conformance.interface.adapter import DEFAULT_IMPL, IMPL_ENV_VAR, Adapter, load_adapter
from infer_ref.conformance.interface.contract import UNSUPPORTED_SEEN, Unsupported
from infer_ref.conformance.profiles import load_default_profile
from infer_ref.conformance.rerun import ENGINE_TESTS
from infer_ref.conformance.tiers import PRECISION_NOTES, set_strict_float64
from infer_ref.conformance.xfail_files import MAY_PASS, matches, xfail_entries
from infer_ref.paths import FIXTURE_CHECKPOINTS

# Register the ci / dev / nightly / mutants profiles before Hypothesis reads --hypothesis-profile,
# so the shipped tests run with them from any directory (no conftest of this repository needed).
load_default_profile()

DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

_STATE: dict[str, object] = {}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("infer_ref", "infer_ref conformance suite")
    group.addoption(
        "--ir-impl",
        default=None,
        metavar="MODULE:OBJECT",
        help=f"implementation under test: an infer_ref.conformance.interface.adapter.Adapter (env {IMPL_ENV_VAR}; default {DEFAULT_IMPL})",
    )
    group.addoption(
        "--ir-xfails",
        action="append",
        default=None,
        metavar="FILE",
        help="expected failures: one test-id prefix per line, '#' starts a comment (repeatable)",
    )
    group.addoption("--ir-device", default="cpu", help="device the suite asks the implementation to use (default cpu)")
    group.addoption(
        "--ir-dtype",
        default="float64",
        choices=list(DTYPES),
        help="model / attention dtype (default float64, the exact tier; bfloat16/float16 use the golden files' tie-aware tolerances)",
    )
    group.addoption("--ir-report", default=None, metavar="FILE", help="write the conformance report (.md or .json)")
    group.addoption("--ir-strict-float64", action="store_true", default=False,
                    help="float64: fail logits that reach only the 'float64 with float32 intermediates' tier "
                         "(default: a precision note)")
    group.addoption("--ir-engine", default=None, metavar="ENGINE",
                    help="engine tier: vllm, vllm-server, llama.cpp, llama.cpp-server, ctranslate2, onnxruntime-genai, openvino, infer_ref, transformers, transformers-cb or module:FACTORY")
    group.addoption("--ir-endpoint", default=None, metavar="URL",
                    help="engine tier: an OpenAI-compatible server's base URL (http://127.0.0.1:PORT/v1)")
    group.addoption("--ir-model-dir", action="append", default=None, metavar="DIR",
                    help="engine tier: a checkpoint folder to judge on (repeatable; default: the kit's checkpoints)")
    group.addoption("--ir-long-context", action="store_true", default=False,
                    help="engine tier: the long-context workload only (prompts to 8193 positions on the kit's long "
                         "checkpoints, or the --ir-model-dir folders; its own engine starts)")
    group.addoption("--ir-engine-dtype", default="float32", choices=list(DTYPES),
                    help="engine tier: the dtype engines are started with (default float32)")
    group.addoption("--ir-engine-option", action="append", default=None, metavar="KEY=VALUE",
                    help="engine tier: a keyword of the engine's factory (llama.cpp: kv_cache_type=float16, threads=2; "
                         "repeatable)")
    group.addoption("--ir-tracebacks", action="store_true", default=False,
                    help="engine tier: print pytest's tracebacks of the failures (default: each failure in a line, "
                         "the report and one repro command)")
    group.addoption("--ir-consistency-tolerance", default=None, type=float, metavar="NATS",
                    help="engine tier: self-consistency tolerance for an engine whose spread is not in the kit's table "
                         "(default: the measured one, else the oracle's)")



def engine_tier(config: pytest.Config) -> bool:
    """Whether this run is the engine tier (an engine started or reached, not an adapter): an engine
    option given, or the engine tier's tests named (they judge infer_ref's Engine by default).
    Decided from the command line, so the xdist controller, which collects nothing, knows it too."""
    if config.getoption("--ir-engine") or config.getoption("--ir-endpoint"):
        return True
    named = [str(a) for a in config.args]
    return any(ENGINE_TESTS in a or ENGINE_TESTS.replace(".", "/") in a for a in named)


def _check_engine_checkpoints(config: pytest.Config) -> None:
    """The engine tier with no ``--ir-model-dir`` judges the kit's own checkpoints, which a wheel
    does not ship: refused here, before collection (where it used to end in an INTERNALERROR)."""
    if engine_tier(config) and not config.getoption("--ir-model-dir") and not FIXTURE_CHECKPOINTS.is_dir():
        raise pytest.UsageError(
            "no checkpoints to judge: pass --ir-model-dir DIR, a Hugging Face checkpoint folder (the kit's own "
            f"checkpoints come with a checkout of infer_ref or its wheel: {FIXTURE_CHECKPOINTS} is not there)"
        )


def worker_device(device: str, worker: str | None, count: int) -> str:
    """``cuda`` under xdist worker ``gwN`` -> ``cuda:(N mod count)``; explicit indices and CPUs unchanged."""
    if device != "cuda" or not worker or not worker.startswith("gw") or count < 1:
        return device
    return f"cuda:{int(worker[2:]) % count}"


def impl_spec(config: pytest.Config) -> str:
    return config.getoption("--ir-impl") or os.environ.get(IMPL_ENV_VAR) or DEFAULT_IMPL


def _load_adapter_showing_deprecations(config: pytest.Config, spec: str) -> Adapter:
    """``load_adapter(spec)``; a DeprecationWarning its import raises (an adapter module that
    warns) reaches pytest's warnings summary, which warnings raised while configuring miss."""
    with warnings.catch_warnings(record=True) as raised:
        warnings.simplefilter("always", DeprecationWarning)
        adapter = load_adapter(spec)
    for warning in raised:
        if isinstance(warning.message, DeprecationWarning):
            config.issue_config_time_warning(warning.message, stacklevel=2)
        else:
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    return adapter


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "ir_requires(*capabilities): skip unless the implementation under test supports them"
    )
    config.addinivalue_line("markers", "ir_oracle(name): what the test compares against (reported separately)")
    # The shipped tests' tier markers, registered here too: run from outside a checkout (no pyproject
    # registering them), pytest would warn "Unknown pytest.mark.gpu" at every run.
    config.addinivalue_line("markers", "gpu: needs a CUDA device (run with -m gpu)")
    config.addinivalue_line("markers", "slow: long-running; run with -m slow")
    _check_engine_checkpoints(config)
    spec = impl_spec(config)
    try:
        adapter = _load_adapter_showing_deprecations(config, spec)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    requested = str(config.getoption("--ir-device"))
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise pytest.UsageError(f"--ir-device {requested}: torch {torch.__version__} sees no CUDA device")
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    device = worker_device(requested, worker, gpus)
    if worker and worker.startswith("gw") and worker[2:].isdigit() and gpus:
        torch.cuda.set_device(int(worker[2:]) % gpus)  # plain "cuda" in this worker (the GPU tier too) is its own GPU
    if device == "cuda":
        device = f"cuda:{torch.cuda.current_device()}"  # tensors report an index: compare like with like
    capabilities = adapter.capabilities(device)
    _STATE.update(spec=spec, adapter=adapter, capabilities=capabilities, device=device, dtype=config.getoption("--ir-dtype"))
    xfail_files = config.getoption("--ir-xfails") or []
    for xfail_file in xfail_files:
        if not Path(xfail_file).is_file():
            raise pytest.UsageError(f"--ir-xfails {xfail_file}: no such file")
    if xfail_files:
        dtype_under_test = config.getoption("--ir-engine-dtype" if engine_tier(config) else "--ir-dtype")
        entries = [entry for f in xfail_files for entry in xfail_entries(f, device, dtype_under_test)]
        _STATE["xfails"] = [prefix for prefix, _ in entries]
        _STATE["may_pass"] = {prefix for prefix, strict in entries if not strict}
    set_run_context(impl=spec, device=config.getoption("--ir-device"), dtype=config.getoption("--ir-dtype"))
    set_strict_float64(bool(config.getoption("--ir-strict-float64")))
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist) writes the report
        xfails = _STATE.get("xfails")
        collector = ir_report.Collector(config, spec, adapter, capabilities, xfails if isinstance(xfails, list) else None)
        if engine_tier(config):
            _name_the_engine(collector.report, config)
            _engine_tier_blame(collector, config)
            if config.pluginmanager.hasplugin("xdist"):  # the workers' notes come to the controller
                from infer_ref.conformance.engines.notes import TierNotes

                config.pluginmanager.register(TierNotes(collector.report), "infer_ref_engine_tier_notes")
        config.pluginmanager.register(collector, "infer_ref_report")


def _name_the_engine(report: ir_report.Report, config: pytest.Config) -> None:
    """The engine tier's report names the engine, how it was selected and its dtype, not the
    in-process adapter (here, where the report is made: under xdist the controller collects no test
    and never loads the tier's conftest)."""
    from infer_ref.conformance.engines.settings import TierSettings

    settings = TierSettings.of(config)
    described = settings.describe()
    report.impl = described["impl"]  # what a failure's repro command needs to run the same engine the same way
    report.adapter, report.version = "engine tier:", described["version"]
    report.device, report.dtype = "the engine's", settings.dtype
    report.capabilities = {}


def _engine_tier_blame(collector: ir_report.Collector, config: pytest.Config) -> None:
    """The engine tier's report narrows its failures to one bug class and prints each failure in a
    line with one repro command; pytest's tracebacks (the kit's own source) only with --ir-tracebacks."""
    from infer_ref.conformance.engines import blame, failures

    collector.engine_blame = blame.blame_report
    if not config.getoption("--ir-tracebacks"):
        collector.terminal_lines = failures.terminal_lines
        if config.option.tbstyle == "auto":  # a --tb the user gave stands
            config.option.tbstyle = "no"


def _versions(with_hypothesis: bool = True) -> str:
    parts = [f"python {platform.python_version()}", f"torch {torch.__version__}"]
    for module in ("transformers", "hypothesis") if with_hypothesis else ("transformers",):
        try:
            parts.append(f"{module} {__import__(module).__version__}")
        except ImportError:
            parts.append(f"{module} (not installed)")
    import infer_ref

    parts.append(f"infer_ref {infer_ref.__version__}")
    return ", ".join(parts)


def pytest_report_header(config: pytest.Config) -> list[str]:
    if engine_tier(config):
        return engine_tier_header(config)
    from hypothesis import settings

    adapter = _STATE["adapter"]
    assert isinstance(adapter, Adapter)
    caps = _STATE["capabilities"]
    assert isinstance(caps, dict)
    supported = [c for c, why in caps.items() if why is None]
    missing = [f"{c} ({why})" for c, why in caps.items() if why is not None]
    current = settings()
    device = config.getoption("--ir-device")
    device_name = torch.cuda.get_device_name(device) if device.startswith("cuda") and torch.cuda.is_available() else platform.processor() or platform.machine()
    lines = [
        f"infer_ref conformance: implementation {_STATE['spec']} = {adapter.name} {adapter.version}".rstrip(),
        f"  supports: {', '.join(supported) or '-'}",
        f"  not supported: {'; '.join(missing) or '-'}",
        f"  versions: {_versions()}",
        f"  device: {device} ({device_name}), dtype: {config.getoption('--ir-dtype')}",
        f"  cache contract: {adapter.cache_contract.describe()}",
        f"  hypothesis profile: {settings.get_current_profile_name()} (max_examples={current.max_examples}, "
        f"derandomize={current.derandomize}, deadline={current.deadline})",
    ]
    if "xfails" in _STATE:
        lines.append(f"  xfails: {', '.join(config.getoption('--ir-xfails'))} ({len(_STATE['xfails'])} entries)")  # type: ignore[arg-type]
    return lines


def engine_tier_header(config: pytest.Config) -> list[str]:
    """The engine tier's header: which engine, how started, on what, judged at which tolerances (not
    the in-process adapter's float64 banner, whose cache contract and Hypothesis profile it never uses)."""
    from infer_ref.conformance.engines.settings import TierSettings
    from infer_ref.conformance.engines.workloads.geometry import LONG_GEOMETRY

    settings = TierSettings.of(config)
    engine, endpoint, dtype, long_context = settings.engine, settings.endpoint, settings.dtype, settings.long_context
    try:
        spread = f"{settings.consistency.value:g} nats ({settings.consistency.source})"
    except ValueError as e:
        spread = f"refused ({e})"
    kit = "the kit's long-context checkpoints" if long_context else "the kit's (fixtures and engine checkpoints)"
    longest = LONG_GEOMETRY.max_model_len
    flat, at_longest = settings.oracle_tolerance(), settings.oracle_tolerance(longest)
    grows = f", growing with a request's length past {flat:g} (to {at_longest:g} at {longest} positions)" if at_longest > flat else ""
    lines = [
        f"infer_ref engine tier: {f'endpoint {endpoint}' if endpoint else f'engine {engine}'}, dtype {dtype}"
        + (", the long-context workload" if long_context else ""),
        "  checkpoints: " + (", ".join(str(d) for d in settings.model_dirs) if settings.model_dirs else kit),
        "  workload: " + ("long contexts (the default workload is a run without --long-context)"
                          if long_context else "default (the long-context workload is a run of its own: --long-context)"),
        f"  tolerances: {flat:g} nats from the float64 oracle (transformers){grows if long_context else ''}; "
        f"{spread} between two schedules of the engine",
        f"  versions (the oracle's side): {_versions(with_hypothesis=False)}",
    ]
    if settings.engine_options:
        lines.append(f"  engine options: {', '.join(settings.engine_options)}")
    if "xfails" in _STATE:
        lines.append(f"  xfails: {', '.join(config.getoption('--ir-xfails'))} ({len(_STATE['xfails'])} entries)")  # type: ignore[arg-type]
    return lines


def test_tier(item: pytest.Item) -> str:
    """The tier that runs ``item``: ``gpu`` (``-m gpu``), ``slow`` (``-m slow``) or ``default``."""
    for tier in ("gpu", "slow"):
        if item.get_closest_marker(tier) is not None:
            return tier
    return "default"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The registry loads models: imported when collecting only.
    from infer_ref.conformance.mutants import ALL_BUG_CLASSES

    adapter = _STATE["adapter"]
    assert isinstance(adapter, Adapter)
    caps = _STATE["capabilities"]
    assert isinstance(caps, dict)
    for item in items:
        # Recorded in JUnit XML reports, so the mutant check can say which tier caught each bug.
        item.user_properties.append(("ir_tier", test_tier(item)))
        required = [c for marker in item.iter_markers("ir_requires") for c in marker.args]
        if not required:
            continue  # not a conformance test (the kit's own tests, infer_ref's unit tests)
        item.user_properties.append(("ir_capabilities", sorted(set(required))))
        item.user_properties.append(("ir_bug_classes", ir_report.bug_classes_of(item, ALL_BUG_CLASSES)))
        oracle = item.get_closest_marker("ir_oracle")
        if oracle is not None:
            item.user_properties.append(("ir_oracle", str(oracle.args[0])))
        lacking = [c for c in required if caps.get(c, f"unknown capability {c!r}") is not None]
        if lacking:
            why = "; ".join(f"{c}: {caps.get(c) or 'unknown capability'}" for c in lacking)
            item.add_marker(pytest.mark.skip(reason=f"not supported by {adapter.name} ({why})"))
    entries = _STATE.get("xfails")
    if not isinstance(entries, list):
        return
    lenient = _STATE.get("may_pass")
    may_pass: set[str] = lenient if isinstance(lenient, set) else set()
    for item in items:
        for prefix in entries:
            if matches(item.nodeid, prefix):
                strict = prefix not in may_pass
                item.user_properties.append(("ir_xfail", prefix))
                why = f"listed in an --ir-xfails file: {prefix}" + ("" if strict else f" [{MAY_PASS}]")
                item.add_marker(pytest.mark.xfail(reason=why, strict=strict))
                break


def location_independent_id(item: pytest.Item) -> str:
    """``item``'s node id from its module's file name on (``test_model.py::test_x[qwen3]``): the same
    wherever the kit is installed and whichever directory pytest runs from."""
    return f"{item.path.name}::{item.nodeid.split('::', 1)[1]}"


@pytest.hookimpl(specname="pytest_runtest_call", tryfirst=True)
def pytest_runtest_call_same_examples_everywhere(item: pytest.Item) -> None:
    """A conformance property draws the same examples wherever the kit is installed.

    Hypothesis' pytest plugin keys a parametrized test's derandomized examples (the ``ci`` and
    ``mutants`` profiles) by its node id, which holds the path from pytest's root directory to the
    installed package: the same test drew other examples from another checkout or working directory,
    so an expected failure found at one place was not at another. Set here, after Hypothesis' own
    hook wrapper and before the test runs, the key is the location-independent id instead.
    """
    inner = getattr(getattr(getattr(item, "obj", None), "hypothesis", None), "inner_test", None)
    if inner is not None and hasattr(inner, "_hypothesis_internal_add_digest") and any(item.iter_markers("ir_requires")):
        inner._hypothesis_internal_add_digest = location_independent_id(item).encode()


def _under_test(item: pytest.Item) -> str:
    """The name of what ``item`` judges: the engine (engine-tier tests take a ``model_dir``) or the adapter."""
    if "model_dir" in getattr(item, "fixturenames", ()):
        return str(item.config.getoption("--ir-engine") or item.config.getoption("--ir-endpoint") or "infer_ref")
    return current_adapter().name


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> object:
    """An adapter's :class:`Unsupported` skips a fixed test; in a property it rejected draws, counted here."""
    from hypothesis.errors import Unsatisfiable

    seen, noted, precise = len(UNSUPPORTED_SEEN), len(NOTES), len(PRECISION_NOTES)
    try:
        return (yield)
    except Unsupported as exc:
        item.user_properties.append(("ir_unsupported", [1, str(exc)]))
        pytest.skip(f"unsupported by {_under_test(item)}: {exc}")
    except Unsatisfiable:
        if len(UNSUPPORTED_SEEN) == seen:
            raise
        item.user_properties.append(("ir_unsupported", [len(UNSUPPORTED_SEEN) - seen, UNSUPPORTED_SEEN[seen]]))
        pytest.skip(f"unsupported by {_under_test(item)} for every draw: {UNSUPPORTED_SEEN[seen]}")
    finally:
        if len(NOTES) > noted:
            item.user_properties.append(("ir_notes", sorted(set(NOTES[noted:]))))
        if len(PRECISION_NOTES) > precise:
            item.user_properties.append(("ir_precision", PRECISION_NOTES[precise]))
        if len(UNSUPPORTED_SEEN) > seen and not any(k == "ir_unsupported" for k, _ in item.user_properties):
            item.user_properties.append(("ir_unsupported", [len(UNSUPPORTED_SEEN) - seen, UNSUPPORTED_SEEN[seen]]))


# A CUDA device-side assert (an out-of-range index inside a kernel, say) cannot be caught and
# recovered from: every later CUDA call of the process fails. The first test that hits one is the
# finding; the failures after it in the same process are its consequence and are labelled so.
_CUDA_CONTEXT_LOST = "device-side assert triggered"


def refusal_text(exc: BaseException) -> str:
    """``Type: first line of the message`` of an exception the implementation raised (a refusal,
    not a wrong value: the kit's own checks raise ``AssertionError``)."""
    message = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {message[0][:300]}" if message else type(exc).__name__


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report: pytest.TestReport = yield
    if not report.failed or call.excinfo is None:
        return report
    if call.when == "call" and not isinstance(call.excinfo.value, AssertionError):
        report.user_properties.append(("ir_refusal", refusal_text(call.excinfo.value)))
    first = _STATE.get("cuda_lost_in")
    if first is not None:
        report.user_properties.append(("ir_after_cuda_loss", first))
        report.sections.append(
            ("infer_ref", f"the CUDA context of this process was lost in {first} (device-side assert): this failure may be its consequence; rerun this test alone")
        )
    elif _CUDA_CONTEXT_LOST in str(call.excinfo.value):
        _STATE["cuda_lost_in"] = item.nodeid
        report.user_properties.append(("ir_cuda_lost", item.nodeid))
    return report


@pytest.fixture(scope="session")
def ir_adapter() -> Adapter:
    """The implementation under test."""
    adapter = _STATE["adapter"]
    assert isinstance(adapter, Adapter)
    return adapter


@pytest.fixture(scope="session")
def ir_device() -> str:
    """The device every adapter call receives (this worker's GPU under xdist)."""
    return str(_STATE["device"])


@pytest.fixture(scope="session")
def ir_dtype() -> torch.dtype:
    """The model / attention dtype (``--ir-dtype``); float64 is the exact tier."""
    return DTYPES[str(_STATE["dtype"])]


def current_impl_spec() -> str:
    """``module:OBJECT`` of the implementation under test (what ``--ir-impl`` resolved to)."""
    return str(_STATE["spec"])


def current_adapter() -> Adapter:
    """The adapter selected for this run (for helpers outside fixtures)."""
    adapter = _STATE.get("adapter")
    if not isinstance(adapter, Adapter):
        raise RuntimeError("the infer_ref pytest plugin is not configured")
    return adapter
