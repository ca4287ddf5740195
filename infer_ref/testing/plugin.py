"""pytest plugin of the conformance suite (registered as the ``infer_ref`` pytest11 entry point).

* ``--ir-impl=module:object`` (or ``$INFER_REF_IMPL``) selects the implementation under test, an
  :class:`~infer_ref.testing.adapter.Adapter`; default: infer_ref itself.
* Its capabilities are probed once; a test marked ``@pytest.mark.ir_requires("cache", ...)`` is
  skipped as "not supported by <name>" when the adapter lacks one of them.
* ``--ir-xfails FILE`` marks tests as expected failures: one test-id prefix per line
  (``infer_ref/testing/conformance/test_cache.py::test_reset`` or ``test_cache.py::test_reset``), ``#`` comments;
  entries that match no collected test are reported as stale.
* The report header names the implementation, versions, device and Hypothesis profile.
* Fixtures: ``ir_adapter`` (the Adapter), ``ir_device`` (``--ir-device``, default cpu).
"""

from __future__ import annotations

import os
import platform
import warnings
from pathlib import Path

import pytest
import torch

from infer_ref.testing.adapter import DEFAULT_IMPL, IMPL_ENV_VAR, Adapter, load_adapter
from infer_ref.testing.assertions import set_run_context

_STATE: dict[str, object] = {}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("infer_ref", "infer_ref conformance suite")
    group.addoption(
        "--ir-impl",
        default=None,
        metavar="MODULE:OBJECT",
        help=f"implementation under test: an infer_ref.testing.adapter.Adapter (env {IMPL_ENV_VAR}; default {DEFAULT_IMPL})",
    )
    group.addoption(
        "--ir-xfails",
        default=None,
        metavar="FILE",
        help="expected failures: one test-id prefix per line, '#' starts a comment",
    )
    group.addoption("--ir-device", default="cpu", help="device the suite asks the implementation to use (default cpu)")


def impl_spec(config: pytest.Config) -> str:
    return config.getoption("--ir-impl") or os.environ.get(IMPL_ENV_VAR) or DEFAULT_IMPL


def read_xfails(path: str | Path) -> list[str]:
    """Test-id prefixes from an xfail file: blank lines and ``#`` comments ignored."""
    entries = []
    for raw in Path(path).read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            entries.append(line)
    return entries


def matches(nodeid: str, prefix: str) -> bool:
    """``prefix`` matches the full node id or the id without its directories."""
    return nodeid.startswith(prefix) or nodeid.rsplit("/", 1)[-1].startswith(prefix)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "ir_requires(*capabilities): skip unless the implementation under test supports them"
    )
    spec = impl_spec(config)
    try:
        adapter = load_adapter(spec)
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    _STATE.update(spec=spec, adapter=adapter, capabilities=adapter.capabilities())
    xfail_file = config.getoption("--ir-xfails")
    if xfail_file:
        if not Path(xfail_file).is_file():
            raise pytest.UsageError(f"--ir-xfails {xfail_file}: no such file")
        _STATE["xfails"] = read_xfails(xfail_file)
    set_run_context(impl=spec)


def _versions() -> str:
    parts = [f"python {platform.python_version()}", f"torch {torch.__version__}"]
    for module in ("transformers", "hypothesis"):
        try:
            parts.append(f"{module} {__import__(module).__version__}")
        except ImportError:
            parts.append(f"{module} (not installed)")
    import infer_ref

    parts.append(f"infer_ref {infer_ref.__version__}")
    return ", ".join(parts)


def pytest_report_header(config: pytest.Config) -> list[str]:
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
        f"  device: {device} ({device_name})",
        f"  hypothesis profile: {settings.get_current_profile_name()} (max_examples={current.max_examples}, "
        f"derandomize={current.derandomize}, deadline={current.deadline})",
    ]
    if "xfails" in _STATE:
        lines.append(f"  xfails: {config.getoption('--ir-xfails')} ({len(_STATE['xfails'])} entries)")  # type: ignore[arg-type]
    return lines


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    adapter = _STATE["adapter"]
    assert isinstance(adapter, Adapter)
    caps = _STATE["capabilities"]
    assert isinstance(caps, dict)
    for item in items:
        for marker in item.iter_markers("ir_requires"):
            lacking = [c for c in marker.args if caps.get(c, f"unknown capability {c!r}") is not None]
            if lacking:
                why = "; ".join(f"{c}: {caps.get(c) or 'unknown capability'}" for c in lacking)
                item.add_marker(pytest.mark.skip(reason=f"not supported by {adapter.name} ({why})"))
                break
    entries = _STATE.get("xfails")
    if not isinstance(entries, list):
        return
    used: set[str] = set()
    for item in items:
        for prefix in entries:
            if matches(item.nodeid, prefix):
                used.add(prefix)
                item.add_marker(pytest.mark.xfail(reason=f"listed in {config.getoption('--ir-xfails')}: {prefix}", strict=False))
                break
    stale = [p for p in entries if p not in used]
    if stale:
        warnings.warn(
            pytest.PytestWarning(
                f"{config.getoption('--ir-xfails')}: stale entries, matching none of the {len(items)} "
                f"collected tests: {', '.join(stale)}"
            ),
            stacklevel=1,
        )


@pytest.fixture(scope="session")
def ir_adapter() -> Adapter:
    """The implementation under test."""
    adapter = _STATE["adapter"]
    assert isinstance(adapter, Adapter)
    return adapter


@pytest.fixture(scope="session")
def ir_device(pytestconfig: pytest.Config) -> str:
    return str(pytestconfig.getoption("--ir-device"))


def current_adapter() -> Adapter:
    """The adapter selected for this run (for helpers outside fixtures)."""
    adapter = _STATE.get("adapter")
    if not isinstance(adapter, Adapter):
        raise RuntimeError("the infer_ref pytest plugin is not configured")
    return adapter
