"""The subprocess bridge against a fake worker: answers, every way a worker can fail, nothing left running."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from engine_processes import gone_within, running

from infer_ref.conformance.engines.adapters.subprocess_bridge import (
    BridgedEngine,
    EngineNotInstalled,
    EngineWorkerError,
    WorkerDied,
    WorkerProtocolError,
    WorkerTimeout,
)
from infer_ref.conformance.engines.adapters.vllm import start_vllm
from infer_ref.conformance.engines.adapters.vllm_server import launch_vllm_server
from infer_ref.conformance.engines.protocol import EngineOptions, EngineRequest
from infer_ref.conformance.interface.contract import Unsupported
from infer_ref.errors import DataError

FAKE_WORKER = Path(__file__).with_name("fake_worker.py")
REPO = Path(__file__).resolve().parents[2]
MODEL_DIR = Path("/nonexistent-model")  # the fake worker never reads it
REQUEST = EngineRequest(prompt=(5, 6, 7), max_tokens=2)


def start_fake(behaviour: str = "ok", *, spawn_child: bool = True, request_timeout: float = 60.0,
               start_timeout: float = 60.0) -> BridgedEngine:  # fmt: skip
    return BridgedEngine.start(
        sys.executable, FAKE_WORKER, MODEL_DIR, EngineOptions(), label="fake",
        start_timeout=start_timeout, request_timeout=request_timeout,
        extra={"behaviour": behaviour, "spawn_child": spawn_child},
    )  # fmt: skip


def worker_and_child(engine: BridgedEngine) -> list[int]:
    """The worker and the grandchild it spawned (the fake names it in its start reply)."""
    return [engine.worker.pid, engine.start_result["child"]]


def test_round_trip_maps_outputs_and_stop_leaves_nothing_running() -> None:
    engine = start_fake()
    pids = worker_and_child(engine)
    assert all(running(pid) for pid in pids)
    assert engine.name == "fake 1.0" and engine.capabilities == frozenset({"batch"})
    [out] = engine.generate([REQUEST])
    assert out.token_ids == (5, 6) and out.text == "5 6" and out.finish_reason == "length"
    assert [(p.token, p.logprob, p.top) for p in out.logprobs] == [(5, -1.0, ((5, -1.0), (6, -2.0))),
                                                                   (6, -1.0, ((6, -1.0), (7, -2.0)))]  # fmt: skip
    log = engine.worker.log_path
    engine.stop()
    engine.stop()  # idempotent
    assert all(gone_within(pid) for pid in pids)
    assert not log.exists(), "a clean stop removes its log"
    with pytest.raises(EngineWorkerError, match="stopped or has failed"):
        engine.generate([REQUEST])


def test_a_crash_names_the_exit_status_and_shows_the_log_tail() -> None:
    engine = start_fake("crash")
    pids = worker_and_child(engine)
    with pytest.raises(WorkerDied) as caught:
        engine.generate([REQUEST])
    message = str(caught.value)
    assert message.splitlines()[0].startswith("fake: the worker died during 'generate' (exit status 7)")
    assert "out of blocks, giving up" in message and str(engine.worker.log_path) in message
    assert all(gone_within(pid) for pid in pids)
    engine.stop()


def test_a_hang_times_out_and_kills_the_group() -> None:
    engine = start_fake("hang", request_timeout=1.5)
    pids = worker_and_child(engine)
    began = time.monotonic()
    with pytest.raises(WorkerTimeout, match=r"no answer to 'generate' within 1.5 s"):
        engine.generate([REQUEST])
    assert time.monotonic() - began < 10
    assert all(gone_within(pid) for pid in pids)


def test_a_hang_at_start_times_out() -> None:
    with pytest.raises(WorkerTimeout, match="no answer to 'start'"):
        start_fake("hang_on_start", start_timeout=1.0)


@pytest.mark.parametrize(
    ("behaviour", "expected"),
    [
        ("not_json", "a line that is not JSON: b'this is not json'"),
        ("malformed", "malformed output: no field 'finish_reason'"),
        ("too_few", "answered 1 requests with 0 answers"),
    ],
)
def test_a_reply_outside_the_protocol_kills_the_worker(behaviour: str, expected: str) -> None:
    engine = start_fake(behaviour)
    pids = worker_and_child(engine)
    with pytest.raises(WorkerProtocolError, match=expected.replace("(", r"\(").replace("[", r"\[")):
        engine.generate([REQUEST])
    assert all(gone_within(pid) for pid in pids)


def test_a_failing_operation_is_one_line_and_the_worker_lives_on() -> None:
    engine = start_fake()
    with pytest.raises(EngineWorkerError) as caught:
        engine.call("fail")
    assert "fail failed: ValueError: the fake engine cannot do that (log:" in str(caught.value)
    assert "second line" not in str(caught.value)
    assert engine.generate([REQUEST])[0].token_ids == (5, 6)
    with pytest.raises(EngineWorkerError, match="unknown operation 'nope'"):
        engine.call("nope")
    engine.stop()


def test_a_refused_option_is_unsupported_and_nothing_runs() -> None:
    with pytest.raises(Unsupported, match="fake: block_size 16 is not a multiple of 32"):
        start_fake("refuse")


def test_an_engine_that_is_not_installed_says_so() -> None:
    with pytest.raises(EngineNotInstalled, match="fake: No module named 'fake_engine'"):
        start_fake("missing")


def test_an_interpreter_that_does_not_exist_is_one_line() -> None:
    with pytest.raises(EngineWorkerError, match="fake: cannot run /nonexistent/python: No such file"):
        BridgedEngine.start("/nonexistent/python", FAKE_WORKER, MODEL_DIR, EngineOptions(), label="fake")


def test_vllm_missing_from_the_interpreter_names_the_fix(tmp_path: Path) -> None:
    # The kit's own interpreter has no vLLM (an engine is never installed beside the kit).
    if subprocess.run([sys.executable, "-c", "import vllm"], capture_output=True).returncode == 0:
        pytest.skip("this interpreter has vllm installed")
    with pytest.raises(EngineNotInstalled) as caught:
        start_vllm(REPO / "fixtures" / "checkpoints" / "llama-tiny", EngineOptions(), python=sys.executable,
                   start_timeout=120)
    message = str(caught.value)
    assert message.startswith(f"vLLM is not installed in {sys.executable}: ")
    assert "No module named 'vllm'" in message and "set INFER_REF_VLLM_PYTHON" in message
    assert "\n" not in message


def test_workers_left_running_are_killed_at_interpreter_exit(tmp_path: Path) -> None:
    script = tmp_path / "leave_running.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from infer_ref.conformance.engines.adapters.subprocess_bridge import BridgedEngine
        from infer_ref.conformance.engines.protocol import EngineOptions
        engine = BridgedEngine.start(sys.executable, Path({str(FAKE_WORKER)!r}), Path("/x"), EngineOptions(),
                                     label="fake", extra={{"spawn_child": True}})
        print(engine.worker.pid, engine.start_result["child"], flush=True)
    """))  # exits without stop()
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp_path)})  # fmt: skip
    assert done.returncode == 0, done.stderr
    pids = [int(pid) for pid in done.stdout.split()]
    assert len(pids) == 2 and all(gone_within(pid) for pid in pids)


def test_a_folder_without_config_is_refused_before_any_start(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=f"{tmp_path} is not a Hugging Face checkpoint folder \\(no config.json\\)"):
        start_vllm(tmp_path, EngineOptions(), python="/nonexistent/python")


def test_vllm_server_missing_from_the_interpreter_names_the_fix() -> None:
    if subprocess.run([sys.executable, "-c", "import vllm"], capture_output=True).returncode == 0:
        pytest.skip("this interpreter has vllm installed")
    with pytest.raises(EngineNotInstalled, match=f"^vLLM is not installed in {re.escape(sys.executable)}: .*"
                       "No module named 'vllm'.*set INFER_REF_VLLM_PYTHON"):  # fmt: skip
        launch_vllm_server(REPO / "fixtures" / "checkpoints" / "llama-tiny", EngineOptions(), python=sys.executable,
                           start_timeout=120)  # fmt: skip
