"""vLLM offline (``vllm.LLM``) behind the subprocess bridge: run with the python of a venv that has vLLM.

Operations (see ``worker_loop.py`` for the wire): ``start`` maps the engine tier's options onto
``vllm.LLM(...)``; ``generate`` runs requests as one ``LLM.generate`` call (one batch) and answers
each as a dict mirroring ``EngineOutput``; ``reset_prefix_cache``; ``stats`` (vLLM's own
counters: preemptions, prefix-cache queries and hits); ``stop``.

Standard library and vLLM only: infer_ref is not installed in vLLM's venv.
"""

from __future__ import annotations

import os
import sys
from typing import Any

# Before vLLM is imported: keep the engine core and its model worker in this process. Nothing
# computed changes (same model runner, same kernels); a start skips two interpreter spawns and
# two imports of vLLM (about 45 s down to about 3 s on two cores), and killing this process's
# group leaves nothing behind.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
# The CPU backend reserves its KV cache up front (GiB) and refuses to start when a shared machine
# has less free memory than its default reservation; the tier's caches are tiny.
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

# A sibling module (the script's folder is on sys.path), imported after the environment is set.
from vllm_capabilities import CAPABILITIES
from vllm_options import declined_dtype, llm_kwargs
from worker_loop import NotInstalled, Refused, serve

_engine: dict[str, Any] = {}  # "llm": the vllm.LLM, "vllm": the module


def start(args: dict[str, Any]) -> dict[str, Any]:
    try:
        import vllm
        from vllm.platforms import current_platform
    except ImportError as err:
        raise NotInstalled(f"vLLM is not importable by {sys.executable}: {err}") from None
    options = args["options"]
    kwargs = llm_kwargs(
        args["model_dir"],
        options,
        is_cpu=current_platform.is_cpu(),
        enforce_eager=bool(args.get("enforce_eager", True)),
    )
    try:
        _engine["llm"] = vllm.LLM(**kwargs)
    except Exception as err:  # vLLM declining the dtype for this model is a limit it states, not a fault
        declined = declined_dtype(str(err), options["dtype"])
        if declined is None:
            raise
        raise Refused(f"vLLM declines {options['dtype']} for this model: {declined}") from None
    _engine["vllm"] = vllm
    capabilities = [*CAPABILITIES, *(["prefix_caching"] if options["prefix_caching"] else [])]
    return {
        "name": f"vllm {vllm.__version__} (offline)",
        "capabilities": capabilities,
        "versions": _versions(vllm),
        "llm_kwargs": {k: v for k, v in kwargs.items() if k != "model"},
    }


def generate(args: dict[str, Any]) -> list[dict[str, Any]]:
    llm, vllm = _engine["llm"], _engine["vllm"]
    requests = args["requests"]
    prompts = [{"prompt_token_ids": list(r["prompt"])} for r in requests]
    params = [_sampling_params(vllm, r) for r in requests]
    outputs = llm.generate(prompts, sampling_params=params, use_tqdm=False)
    return [_output_dict(out, r) for out, r in zip(outputs, requests, strict=True)]


def _sampling_params(vllm: Any, request: dict[str, Any]) -> Any:
    return vllm.SamplingParams(
        max_tokens=request["max_tokens"],
        temperature=request["temperature"],
        seed=request["seed"],
        top_k=request["top_k"],
        top_p=request["top_p"],
        stop=list(request["stop"]) or None,
        ignore_eos=request["ignore_eos"],
        logprobs=request["logprobs"],
        prompt_logprobs=request["prompt_logprobs"],
        detokenize=True,
    )


def _output_dict(result: Any, request: dict[str, Any]) -> dict[str, Any]:
    completion = result.outputs[0]
    tokens = list(completion.token_ids)
    steps = completion.logprobs or []
    if len(steps) != len(tokens):
        raise RuntimeError(f"vLLM returned {len(steps)} logprob entries for {len(tokens)} tokens")
    prompt = None
    if request["prompt_logprobs"] is not None:
        given = list(request["prompt"])
        prompt = [
            None if i == 0 or entry is None else _position(given[i], entry, request["prompt_logprobs"])
            for i, entry in enumerate(result.prompt_logprobs or [None] * len(given))
        ]
    return {
        "token_ids": tokens,
        "text": completion.text,
        "logprobs": [
            _position(t, entry, request["logprobs"]) for t, entry in zip(tokens, steps, strict=True)
        ],
        "prompt_logprobs": prompt,
        "finish_reason": completion.finish_reason,
        "cached_tokens": getattr(result, "num_cached_tokens", None),
    }


def _position(token: int, entry: dict[int, Any], k: int) -> dict[str, Any]:
    """One position: vLLM's dict holds the chosen token first, then its top-k, each with a rank.

    The top-k are the entries ranked 1..k, ordered by vLLM's own rank; the chosen token joins
    them only when it is one of them (its rank is then <= k).
    """
    ranked = sorted(
        ((lp.rank, tok, lp.logprob) for tok, lp in entry.items() if lp.rank is not None and lp.rank <= k),
        key=lambda item: item[0],
    )
    return {"token": token, "logprob": entry[token].logprob, "top": [[tok, lp] for _, tok, lp in ranked]}


def reset_prefix_cache(args: dict[str, Any]) -> None:
    if not _engine["llm"].reset_prefix_cache():
        raise RuntimeError("vLLM refused to reset its prefix cache (requests still running?)")


STAT_COUNTERS = {
    "vllm:num_preemptions": "preemptions",
    "vllm:prefix_cache_queries": "prefix_cache_queries",
    "vllm:prefix_cache_hits": "prefix_cache_hits",
    "vllm:prompt_tokens": "prompt_tokens",
    "vllm:generation_tokens": "generation_tokens",
}


def stats(args: dict[str, Any]) -> dict[str, float]:
    """vLLM's own counters since start (summed over engines)."""
    totals = dict.fromkeys(STAT_COUNTERS.values(), 0.0)
    for metric in _engine["llm"].get_metrics():
        if metric.name in STAT_COUNTERS and hasattr(metric, "value"):
            totals[STAT_COUNTERS[metric.name]] += float(metric.value)
    return totals


def stop(args: dict[str, Any]) -> None:
    _engine.clear()


def _versions(vllm: Any) -> dict[str, str]:
    import torch
    import transformers

    return {
        "vllm": vllm.__version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": sys.version.split()[0],
    }


if __name__ == "__main__":
    sys.exit(
        serve(
            {
                "start": start,
                "generate": generate,
                "reset_prefix_cache": reset_prefix_cache,
                "stats": stats,
                "stop": stop,
            }
        )
    )
