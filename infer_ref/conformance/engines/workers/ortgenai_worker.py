"""ONNX Runtime GenAI (``onnxruntime_genai``) behind the subprocess bridge.

Run with the python of a venv that has onnxruntime-genai. Operations (see ``worker_loop.py``):
``start`` opens the folder its model builder wrote (``og.Model``); ``generate`` runs the requests
one after the other, each in a ``og.Generator`` of its own; ``stop``.

What ONNX Runtime GenAI decides itself and is judged: the logits of every position (the decoder
graph its builder wrote, run by onnxruntime), its K/V cache across ``append_tokens`` calls (a
prompt appended in slices of ``max_num_batched_tokens`` tokens is its chunked prefill), greedy
search and sampling (temperature, top-k, top-p, ``random_seed``), end-of-generation (``is_done``
at an ``eos_token_id`` of the genai_config.json the builder wrote) and detokenisation
(``og.Tokenizer``). Logprobs are the log-softmax (float64) of the raw logits rows
(``get_output("logits")``): after the prompt is appended they cover every prompt position (prompt
logprobs), then each step's row is the one its token was chosen from.

Not offered by its Python API, so not declared: a prefix cache shared between requests, batching
of prompts of different lengths without padding them, stop strings, ignoring EOS, a K/V budget.

Standard library, numpy and onnxruntime-genai only: infer_ref is not installed in that venv.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from worker_loop import NotInstalled, Refused, position_from_logits, serve

CAPABILITIES = ("prompt_logprobs", "seed", "top_k_top_p", "top_logprobs", "chunked_prefill")

_engine: dict[str, Any] = {}


def start(args: dict[str, Any]) -> dict[str, Any]:
    try:
        import numpy
        import onnxruntime_genai as og
    except ImportError as err:
        raise NotInstalled(f"onnxruntime-genai is not importable by {sys.executable}: {err}") from None
    options = args["options"]
    _refuse_what_cannot_be_honoured(options)
    model = og.Model(args["onnx_dir"])
    config = _genai_config(args["onnx_dir"])
    _engine.update(
        og=og,
        numpy=numpy,
        model=model,
        tokenizer=og.Tokenizer(model),
        vocab=int(config["vocab_size"]),
        chunk=options.get("max_num_batched_tokens"),
        eos=_eos_ids(config),
    )
    versions = {
        "onnxruntime_genai": og.__version__,
        "onnxruntime": _onnxruntime_version(),
        "numpy": numpy.__version__,
        "python": sys.version.split()[0],
    }
    return {
        "name": f"ONNX Runtime GenAI {og.__version__} (onnxruntime {versions['onnxruntime']}, CPU)",
        "capabilities": list(CAPABILITIES),
        "versions": versions,
    }


def _refuse_what_cannot_be_honoured(options: dict[str, Any]) -> None:
    if options.get("prefix_caching"):
        raise Refused("ONNX Runtime GenAI has no prefix cache shared between requests (prefix_caching asked)")
    if (options.get("max_num_seqs") or 1) > 1:
        raise Refused("the adapter runs one request at a time (max_num_seqs > 1 asked)")
    budget, longest = options.get("kv_cache_tokens"), options.get("max_model_len")
    if budget is not None and longest is not None and budget < longest:
        raise Refused(
            f"ONNX Runtime GenAI sizes each request's K/V cache to its own length; a KV budget of {budget} "
            f"tokens below max_model_len {longest} would not be honoured"
        )


def _onnxruntime_version() -> str:
    try:
        import onnxruntime

        return str(onnxruntime.__version__)
    except ImportError:
        return "?"


def generate(args: dict[str, Any]) -> list[dict[str, Any]]:
    return [_complete(request) for request in args["requests"]]


def _search_options(request: dict[str, Any], max_length: int, vocab: int) -> dict[str, Any]:
    """The request as ``GeneratorParams.set_search_options``: greedy at temperature 0; top_k 0
    (the protocol's "off") is the whole vocabulary, since the engine's own default is 50."""
    search: dict[str, Any] = {
        "max_length": max_length,
        "min_length": 0,
        "batch_size": 1,
        "num_beams": 1,
        "repetition_penalty": 1.0,
        "do_sample": request["temperature"] > 0,
    }
    if search["do_sample"]:
        search.update(
            temperature=float(request["temperature"]),
            top_p=float(request["top_p"]),
            top_k=int(request["top_k"]) or vocab,
        )
        if request["seed"] is not None:
            search["random_seed"] = int(request["seed"])
    return search


def _complete(request: dict[str, Any]) -> dict[str, Any]:
    og, np = _engine["og"], _engine["numpy"]
    prompt = list(request["prompt"])
    params = og.GeneratorParams(_engine["model"])
    params.set_search_options(
        **_search_options(request, len(prompt) + request["max_tokens"], _engine["vocab"])
    )
    generator = og.Generator(_engine["model"], params)
    prompt_rows = []  # the logits rows of every prompt position, slice by slice
    chunk = _engine["chunk"] or len(prompt)
    for begin in range(0, len(prompt), chunk):
        generator.append_tokens(np.array(prompt[begin : begin + chunk], dtype=np.int32))
        prompt_rows.append(
            np.array(generator.get_output("logits")).reshape(-1, _engine["vocab"])
        )  # [slice, vocab]
    tokens: list[int] = []
    steps: list[dict[str, Any]] = []
    finish = "length"
    while len(tokens) < request["max_tokens"]:
        row = np.array(generator.get_logits()).reshape(-1, _engine["vocab"])[-1]  # [vocab]: this step's
        generator.generate_next_token()
        token = int(generator.get_next_tokens()[0])
        steps.append(_position(token, row, request["logprobs"]))
        tokens.append(token)
        if token in _engine["eos"]:
            finish = "stop"
            break
        if generator.is_done():  # the engine ended it without an EOS: at max_length
            break
    prompt_logprobs = None
    if request["prompt_logprobs"] is not None:  # rows 0..P-2 predict prompt tokens 1..P-1
        rows = np.concatenate(prompt_rows)  # [P, vocab]
        prompt_logprobs = [None] + [
            _position(prompt[i], rows[i - 1], request["prompt_logprobs"]) for i in range(1, len(prompt))
        ]
    return {
        "token_ids": tokens,
        "text": _engine["tokenizer"].decode(np.array(tokens, dtype=np.int32)),
        "logprobs": steps,
        "prompt_logprobs": prompt_logprobs,
        "finish_reason": finish,
        "cached_tokens": None,
    }


def _genai_config(onnx_dir: str) -> dict[str, Any]:
    """The "model" section of the genai_config.json the builder wrote (what the engine reads too)."""
    with open(os.path.join(onnx_dir, "genai_config.json"), encoding="utf-8") as f:
        return dict(json.load(f)["model"])


def _eos_ids(config: dict[str, Any]) -> set[int]:
    """The end-of-generation ids the engine stops at (``eos_token_id``)."""
    eos = config["eos_token_id"]
    return set(eos if isinstance(eos, list) else [eos])


def _position(token: int, logits: Any, k: int) -> dict[str, Any]:
    return position_from_logits(_engine["numpy"], token, logits, k)


def stop(args: dict[str, Any]) -> None:
    _engine.clear()


if __name__ == "__main__":
    sys.exit(serve({"start": start, "generate": generate, "stop": stop}))
