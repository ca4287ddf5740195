"""llama-cpp-python's OpenAI-compatible server (``llama_cpp.server``) on the tier's options.

``python llamacpp_serve.py GGUF OPTIONS_JSON KV_CACHE_TYPE THREADS PORT`` maps the options exactly
as the in-process worker does (``llamacpp_worker.llama_kwargs``), then runs ``llama_cpp.server`` in
this process on 127.0.0.1, as ``python -m llama_cpp.server --model GGUF ...`` would. An option it
cannot honour ends the script with exit status 3 and a line ``unsupported: REASON`` on stderr.

Standard library and llama-cpp-python only: infer_ref is not installed in that venv.
"""

from __future__ import annotations

import json
import runpy
import sys
from typing import Any

from llamacpp_worker import llama_kwargs
from worker_loop import Refused

UNSUPPORTED_EXIT = 3


def cli_flags(kwargs: dict[str, Any]) -> list[str]:
    """``Llama`` keyword arguments as the server's flags (its flags are the field names)."""
    flags = ["--model", str(kwargs.pop("model_path"))]
    for name, value in kwargs.items():
        flags += [f"--{name}", str(value)]
    return flags


def main(argv: list[str]) -> int:
    gguf, options_json, kv_cache_type, threads, port = argv
    try:
        import llama_cpp
        import llama_cpp.server  # the server extra (fastapi, uvicorn)
    except ImportError as err:
        print(
            f"missing: llama-cpp-python[server] is not importable by {sys.executable}: {err}", file=sys.stderr
        )
        return UNSUPPORTED_EXIT
    options = json.loads(options_json)
    try:
        if not options["prefix_caching"]:
            # Each request runs Llama.create_completion on the server's one Llama, which reuses the
            # previous request's longest common prefix of K/V; no server setting turns that off.
            raise Refused(
                "llama_cpp.server always reuses the previous request's prefix (no setting turns it off)"
            )
        kwargs = llama_kwargs(gguf, options, kv_cache_type, int(threads), llama_cpp)
    except Refused as err:
        print(f"unsupported: {err}", file=sys.stderr)
        return UNSUPPORTED_EXIT
    sys.argv = ["llama_cpp.server", *cli_flags(kwargs), "--host", "127.0.0.1", "--port", port]
    runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
