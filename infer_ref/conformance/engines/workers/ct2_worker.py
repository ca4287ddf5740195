"""CTranslate2's ``Generator`` behind the subprocess bridge: run with the python of a venv that has
ctranslate2.

Operations (see ``worker_loop.py``): ``start`` opens the converted model directory with the tier's
dtype as the compute type; ``generate`` runs the requests through ``Generator.generate_batch``,
requests that share their generation settings in one call (a batch: settings are per call, not
per request), and the prompt logprobs through ``Generator.forward_batch`` (teacher forcing: the
full logits of every prompt position in one forward); ``stop``.

What CTranslate2 decides itself and is judged: the logits of every step (``return_logits_vocab``:
the full row the step's token was chosen from; logprobs are its log-softmax in float64), the
greedy and sampled choice (``sampling_topk``, ``sampling_topp``, ``sampling_temperature``, the
random seed set by ``ctranslate2.set_random_seed`` before each call), the end tokens (the
converted model's own, read by the converter from the checkpoint), the prompt's logits. The text
is the checkpoint tokenizer's decoding (transformers, as CTranslate2's own examples do): CTranslate2
has no detokenizer.

Standard library, ctranslate2, numpy and transformers only: infer_ref is not installed in that venv.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from worker_loop import NotInstalled, Refused, position_from_logits, serve

# What CTranslate2's Generator can do for the tier (no prefix cache it reuses across calls by
# itself, no chunked prefill, no KV budget, no stop strings: see docs/engines.md).
CAPABILITIES = ("prompt_logprobs", "seed", "batch", "top_k_top_p", "ignore_eos", "top_logprobs")

_engine: dict[str, Any] = {}


def start(args: dict[str, Any]) -> dict[str, Any]:
    try:
        import ctranslate2
        import numpy
        from transformers import AutoTokenizer
    except ImportError as err:
        raise NotInstalled(f"ctranslate2 is not importable by {sys.executable}: {err}") from None
    options = args["options"]
    if options["prefix_caching"]:
        raise Refused(
            "CTranslate2's Generator keeps no prefix cache across calls (only a static_prompt named by the "
            "caller)"
        )
    if options.get("max_num_batched_tokens") is not None:
        raise Refused("CTranslate2's Generator prefills a prompt in one forward: no chunked-prefill budget")
    supported = sorted(ctranslate2.get_supported_compute_types("cpu"))
    if args["compute_type"] not in supported:  # asked anyway, CTranslate2 would compute in another type
        raise Refused(
            f"CTranslate2 {ctranslate2.__version__} computes no {args['compute_type']} on this CPU "
            f"(its compute types here: {', '.join(supported)})"
        )
    kwargs = {
        "device": "cpu",
        "compute_type": args["compute_type"],
        "intra_threads": int(args.get("threads", 1)),
        "inter_threads": 1,
    }
    generator = ctranslate2.Generator(args["converted"], **kwargs)
    _engine.update(
        vocabulary=_vocabulary(args["converted"]),
        generator=generator,
        ctranslate2=ctranslate2,
        numpy=numpy,
        max_batch=options.get("max_num_seqs") or 0,
        tokenizer=AutoTokenizer.from_pretrained(args["model_dir"]),
    )
    return {
        "name": f"CTranslate2 {ctranslate2.__version__} Generator ({args['compute_type']})",
        "capabilities": list(CAPABILITIES),
        "versions": {
            "ctranslate2": ctranslate2.__version__,
            "numpy": numpy.__version__,
            "python": sys.version.split()[0],
        },
        "generator_kwargs": kwargs,
    }


def _vocabulary(converted: str) -> list[str]:
    """The converted model's tokens by id (vocabulary.json, written by the converter): generate_batch
    takes a prompt as token strings only."""
    with open(os.path.join(converted, "vocabulary.json"), encoding="utf-8") as f:
        return list(json.load(f))


def generate(args: dict[str, Any]) -> list[dict[str, Any]]:
    requests = args["requests"]
    size = len(_engine["vocabulary"])
    for i, r in enumerate(requests):
        if any(t >= size for t in r["prompt"]):
            raise ValueError(f"request {i}: a prompt token id is not below the vocabulary's {size} tokens")
        if r["stop"]:
            raise Refused(f"request {i}: CTranslate2's Generator has no stop strings (only end tokens)")
    answers: list[dict[str, Any] | None] = [None] * len(requests)
    for group in _groups(requests):
        for i, answer in zip(group, _call([requests[i] for i in group]), strict=True):
            answers[i] = answer
    return [a for a in answers if a is not None]


def _groups(requests: list[dict[str, Any]]) -> list[list[int]]:
    """Indices of requests whose settings can share one generate_batch call, in order of first appearance."""
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, r in enumerate(requests):
        key = (r["max_tokens"], r["temperature"], r["top_k"], r["top_p"], r["ignore_eos"], r["seed"])
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def generate_kwargs(request: dict[str, Any]) -> dict[str, Any]:
    """``Generator.generate_batch`` settings for a group's shared request settings."""
    greedy = request["temperature"] == 0
    kwargs: dict[str, Any] = {
        "max_length": request["max_tokens"],
        "include_prompt_in_result": False,
        "return_logits_vocab": True,
        "return_end_token": True,
        "sampling_topk": 1 if greedy else (request["top_k"] or 0),
        "sampling_topp": request["top_p"],
        "sampling_temperature": 1.0 if greedy else request["temperature"],
        "max_batch_size": _engine.get("max_batch", 0),
    }
    if request["ignore_eos"]:
        kwargs["end_token"] = []  # no end token: generation stops at max_length only
    return kwargs


def _call(requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    generator, ctranslate2 = _engine["generator"], _engine["ctranslate2"]
    first = requests[0]
    if first["seed"] is not None:
        ctranslate2.set_random_seed(first["seed"])
    vocabulary = _engine["vocabulary"]
    prompts = [[vocabulary[t] for t in r["prompt"]] for r in requests]
    results = generator.generate_batch(prompts, **generate_kwargs(first))
    return [_answer(r, result) for r, result in zip(requests, results, strict=True)]


def _answer(request: dict[str, Any], result: Any) -> dict[str, Any]:
    np = _engine["numpy"]
    tokens = [int(t) for t in result.sequences_ids[0]]
    rows = result.logits[0]  # one StorageView of logits [V] per generated step
    steps = [
        _position(token, np.array(row), request["logprobs"]) for token, row in zip(tokens, rows, strict=False)
    ]
    if len(steps) != len(tokens):
        raise RuntimeError(f"generate_batch returned {len(tokens)} tokens but {len(steps)} logits rows")
    prompt_logprobs = None
    if request["prompt_logprobs"] is not None:
        prompt_logprobs = _prompt_logprobs(list(request["prompt"]), request["prompt_logprobs"])
    finish = "length" if len(tokens) >= request["max_tokens"] else "stop"
    return {
        "token_ids": tokens,
        "text": _engine["tokenizer"].decode(tokens, skip_special_tokens=True),
        "logprobs": steps,
        "prompt_logprobs": prompt_logprobs,
        "finish_reason": finish,
        "cached_tokens": None,
    }


def _prompt_logprobs(prompt: list[int], k: int) -> list[dict[str, Any] | None]:
    """Rows 0..P-2 of the prompt's forward predict prompt tokens 1..P-1; position 0 has none."""
    np = _engine["numpy"]
    logits = np.array(_engine["generator"].forward_batch([prompt]))[0]  # [P, V] float32
    return [None] + [_position(prompt[i], logits[i - 1], k) for i in range(1, len(prompt))]


def _position(token: int, logits: Any, k: int) -> dict[str, Any]:
    return position_from_logits(_engine["numpy"], token, logits, k)


def stop(args: dict[str, Any]) -> None:
    _engine.clear()


if __name__ == "__main__":
    sys.exit(serve({"start": start, "generate": generate, "stop": stop}))
