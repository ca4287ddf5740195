"""A stand-in engine worker for the subprocess bridge's tests: behaves, crashes, hangs or lies on demand.

``start``'s ``behaviour`` picks what ``generate`` does; ``spawn_child`` starts a grandchild (a
sleeping process) whose pid ``start`` returns, so a test can check that nothing is left running.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "infer_ref" / "conformance" / "engines" / "workers"))
from worker_loop import NotInstalled, Refused, serve

STATE: dict[str, Any] = {}


def start(args: dict[str, Any]) -> dict[str, Any]:
    behaviour = args.get("behaviour", "ok")
    if behaviour == "missing":
        raise NotInstalled("No module named 'fake_engine'")
    if behaviour == "refuse":
        raise Refused("block_size 16 is not a multiple of 32")
    if behaviour == "hang_on_start":
        time.sleep(3600)
    STATE["behaviour"] = behaviour
    child = None
    if args.get("spawn_child"):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"]).pid
    return {"name": "fake 1.0", "capabilities": ["batch"], "versions": {"fake": "1.0"}, "child": child}


def generate(args: dict[str, Any]) -> Any:
    behaviour = STATE["behaviour"]
    if behaviour == "crash":
        print("fake engine: out of blocks, giving up", file=sys.stderr, flush=True)
        os._exit(7)
    if behaviour == "hang":
        time.sleep(3600)
    if behaviour == "not_json":
        os.write(int(sys.argv[2]), b"this is not json\n")
        time.sleep(3600)
    if behaviour == "malformed":
        return [{"token_ids": [1], "text": "x"} for _ in args["requests"]]
    if behaviour == "too_few":
        return []
    return [_echo(r) for r in args["requests"]]


def _echo(request: dict[str, Any]) -> dict[str, Any]:
    """Generates the prompt back (up to max_tokens), each token with logprob -1 and a top-2."""
    tokens = list(request["prompt"])[: request["max_tokens"]]
    step = [{"token": t, "logprob": -1.0, "top": [[t, -1.0], [t + 1, -2.0]]} for t in tokens]
    return {"token_ids": tokens, "text": " ".join(map(str, tokens)), "logprobs": step,
            "finish_reason": "length", "prompt_logprobs": None, "cached_tokens": 0}  # fmt: skip


def fail(args: dict[str, Any]) -> None:
    raise ValueError("the fake engine cannot do that\nsecond line of detail")


if __name__ == "__main__":
    sys.exit(serve({"start": start, "generate": generate, "fail": fail}))
