"""vLLM's OpenAI-compatible server on the engine tier's options: run with the python of a venv with vLLM.

``python vllm_serve.py MODEL_DIR OPTIONS_JSON PORT ENFORCE_EAGER`` maps the options exactly as the
offline worker does (``vllm_options.py``), then runs ``vllm.entrypoints.openai.api_server`` in this
process on 127.0.0.1 (the ``vllm serve`` entry point of the CPU build looks for a distribution
named ``vllm`` and fails). An option vLLM cannot honour ends the script with exit status 3 and a
line ``unsupported: REASON`` on stderr, which the launcher turns into ``Unsupported``.

Standard library and vLLM only: infer_ref is not installed in vLLM's venv.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from typing import Any

# As offline: same kernels, one process fewer (the server's engine core still runs apart); measured
# on two shared cores, a start of 23-41 s against 42-44 s with it on.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
# The CPU backend reserves its KV cache up front (GiB); the tier's caches are tiny.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
# Exposes POST /reset_prefix_cache (a development endpoint) so the tier can empty the cache.
os.environ.setdefault("VLLM_SERVER_DEV_MODE", "1")

from vllm_options import llm_kwargs
from worker_loop import Refused

UNSUPPORTED_EXIT = 3
SERVER_FLAGS = ["--host", "127.0.0.1", "--max-logprobs", "20", "--enable-prompt-tokens-details"]


def cli_flags(kwargs: dict[str, Any]) -> list[str]:
    """``vllm.LLM`` keyword arguments as the server's flags (``--no-X`` for a false boolean)."""
    flags: list[str] = []
    for name, value in kwargs.items():
        flag = "--" + name.replace("_", "-")
        if name == "disable_log_stats":
            flags += [flag] if value else []
        elif isinstance(value, bool):
            flags.append(flag if value else "--no-" + flag[2:])
        else:
            flags += [flag, str(value)]
    return flags


def main(argv: list[str]) -> int:
    model_dir, options_json, port, enforce_eager = argv
    try:
        from vllm.platforms import current_platform
    except ImportError as err:
        print(f"missing: vLLM is not importable by {sys.executable}: {err}", file=sys.stderr)
        return UNSUPPORTED_EXIT
    try:
        kwargs = llm_kwargs(
            model_dir,
            json.loads(options_json),
            is_cpu=current_platform.is_cpu(),
            enforce_eager=enforce_eager == "1",
        )
    except Refused as err:
        print(f"unsupported: {err}", file=sys.stderr)
        return UNSUPPORTED_EXIT
    sys.argv = ["vllm.entrypoints.openai.api_server", *cli_flags(kwargs), "--port", port, *SERVER_FLAGS]
    runpy.run_module("vllm.entrypoints.openai.api_server", run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
