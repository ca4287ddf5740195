"""llama.cpp in-process (llama-cpp-python's ``Llama``) behind the subprocess bridge.

Run with the python of a venv that has llama-cpp-python. Operations (see ``worker_loop.py``):
``start`` opens the GGUF file with the tier's options (:func:`llama_kwargs`); ``generate`` runs the
requests one after the other (``Llama`` holds one sequence: there is no batch) through the
token-level ``Llama.generate``, reading each step's full logits from ``Llama.scores``
(``logits_all=True``); ``reset_prefix_cache``; ``stop``.

What llama-cpp-python decides itself and is judged: the logits of every position, sampling (its
llama.cpp sampler chain with the request's temperature, top-k, top-p and seed), end-of-generation
ids (``llama_vocab_is_eog``, as its own ``create_completion`` asks), detokenisation, and the reuse
of the previous request's longest common prefix of K/V (``Llama.generate`` keeps it unless the
state was reset: the engine's one-entry prefix cache, off when ``prefix_caching`` is off). The
token-level API has no stop strings (``create_completion`` has them, in Python): this worker cuts
the detokenized text at a stop string's first occurrence, so ``stop_strings`` judges llama.cpp's
detokenization and end-of-generation, not a stop implementation of llama.cpp's own.

Standard library, numpy and llama-cpp-python only: infer_ref is not installed in that venv.
"""

from __future__ import annotations

import sys
from typing import Any

from worker_loop import NotInstalled, Refused, position_from_logits, serve

# Always: what Llama can do; "prefix_caching" joins when it is on.
CAPABILITIES = (
    "prompt_logprobs",
    "seed",
    "stop_strings",
    "reset_prefix_cache",
    "chunked_prefill",
    "top_k_top_p",
    "ignore_eos",
    "top_logprobs",
)
# ggml's type ids (enum ggml_type: F32 0, F16 1, BF16 30); llama_cpp exports no name for BF16.
KV_TYPES = {"float32": 0, "float16": 1, "bfloat16": 30}
DEFAULT_CONTEXT = 512

_engine: dict[str, Any] = {}


def llama_kwargs(
    gguf: str, options: dict[str, Any], kv_cache_type: str, threads: int, llama_cpp: Any
) -> dict[str, Any]:
    """``llama_cpp.Llama`` keyword arguments for the tier's options; refuses what it cannot honour.

    ``n_ctx`` (the K/V cells of the one sequence) is ``max_model_len``; a prompt is evaluated in
    ``Llama.eval`` slices of ``n_batch`` tokens, each decoded in physical batches of ``n_ubatch``:
    the chunked-prefill budget sets both, and without one a whole prompt is one slice.
    """
    n_ctx = options.get("max_model_len") or DEFAULT_CONTEXT
    budget = options.get("kv_cache_tokens")
    if budget is not None and budget < n_ctx:
        raise Refused(
            f"llama.cpp holds one sequence of n_ctx = max_model_len = {n_ctx} cells; a KV budget of "
            f"{budget} tokens below it would be a smaller context, not a shared pool"
        )
    if (options.get("max_num_seqs") or 1) > 1:
        raise Refused("llama-cpp-python's Llama runs one sequence at a time (max_num_seqs > 1 asked)")
    chunk = options.get("max_num_batched_tokens") or n_ctx
    if kv_cache_type not in KV_TYPES:
        raise Refused(f"no llama.cpp KV cache type for {kv_cache_type!r} (known: {', '.join(KV_TYPES)})")
    kv_type = KV_TYPES[kv_cache_type]
    return {
        "model_path": gguf,
        "logits_all": True,
        "n_ctx": n_ctx,
        "n_batch": chunk,
        "n_ubatch": chunk,
        "type_k": kv_type,
        "type_v": kv_type,
        "flash_attn": False,
        "seed": 0,
        "n_threads": threads,
        "n_threads_batch": threads,
        "verbose": False,
    }


def start(args: dict[str, Any]) -> dict[str, Any]:
    try:
        import llama_cpp
        import numpy
    except ImportError as err:
        raise NotInstalled(f"llama-cpp-python is not importable by {sys.executable}: {err}") from None
    options = args["options"]
    kwargs = llama_kwargs(
        args["gguf"], options, args["kv_cache_type"], int(args.get("threads", 1)), llama_cpp
    )
    _engine.update(
        llm=llama_cpp.Llama(**kwargs),
        llama_cpp=llama_cpp,
        numpy=numpy,
        prefix_caching=bool(options["prefix_caching"]),
    )
    capabilities = [*CAPABILITIES, *(["prefix_caching"] if options["prefix_caching"] else [])]
    return {
        "name": f"llama.cpp (llama-cpp-python {llama_cpp.__version__}, in-process)",
        "capabilities": capabilities,
        "versions": _versions(llama_cpp, numpy),
        "llama_kwargs": {k: v for k, v in kwargs.items() if k != "model_path"},
    }


def _versions(llama_cpp: Any, numpy: Any) -> dict[str, str]:
    return {
        "llama_cpp_python": llama_cpp.__version__,
        "numpy": numpy.__version__,
        "python": sys.version.split()[0],
    }


def generate(args: dict[str, Any]) -> list[dict[str, Any]]:
    return [_complete(request) for request in args["requests"]]


def _complete(request: dict[str, Any]) -> dict[str, Any]:
    llm, llama_cpp = _engine["llm"], _engine["llama_cpp"]
    if not _engine["prefix_caching"]:
        llm.reset()  # Llama.generate then reuses nothing of the previous request
    if request["seed"] is not None:
        llm.set_seed(request["seed"])
    prompt = list(request["prompt"])
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    tokens: list[int] = []
    steps: list[dict[str, Any]] = []
    finish, cut = "length", None
    for token in llm.generate(
        prompt,
        top_k=request["top_k"],
        top_p=request["top_p"],
        min_p=0.0,
        typical_p=1.0,
        temp=request["temperature"],
        repeat_penalty=1.0,
    ):
        # The token was sampled from the last evaluated position's logits.
        steps.append(_position(token, llm.scores[llm.n_tokens - 1], request["logprobs"]))
        tokens.append(token)
        if not request["ignore_eos"] and llama_cpp.llama_vocab_is_eog(vocab, token):
            finish = "stop"
            break
        cut = _earliest_stop(_text(llm, tokens, prompt), request["stop"])
        if cut is not None:
            finish = "stop"
            break
        if len(tokens) >= request["max_tokens"]:
            break
    text = _text(llm, tokens, prompt)
    prompt_logprobs = None
    if request["prompt_logprobs"] is not None:  # rows 0..P-2 of this sequence predict prompt tokens 1..P-1
        prompt_logprobs = [None] + [
            _position(prompt[i], llm.scores[i - 1], request["prompt_logprobs"]) for i in range(1, len(prompt))
        ]
    return {
        "token_ids": tokens,
        "text": text if cut is None else text[:cut],
        "logprobs": steps,
        "prompt_logprobs": prompt_logprobs,
        "finish_reason": finish,
        "cached_tokens": None,
    }


def _text(llm: Any, tokens: list[int], prompt: list[int]) -> str:
    """The generated text as llama-cpp-python returns it: the detokenized bytes, invalid UTF-8 dropped.

    Stop strings are searched here, in the text the user gets. (``create_completion`` searches the
    raw bytes, where a token that is no valid UTF-8 still sits between two characters the text
    shows side by side, so a stop string visible in its answer can be missed.)
    """
    return bytes(llm.detokenize(tokens, prev_tokens=prompt)).decode("utf-8", errors="ignore")


def _earliest_stop(text: str, stops: list[str]) -> int | None:
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found) if found else None


def _position(token: int, logits: Any, k: int) -> dict[str, Any]:
    return position_from_logits(_engine["numpy"], token, logits, k)


def reset_prefix_cache(args: dict[str, Any]) -> None:
    _engine["llm"].reset()


def stop(args: dict[str, Any]) -> None:
    llm = _engine.pop("llm", None)
    if llm is not None:
        llm.close()
    _engine.clear()


if __name__ == "__main__":
    sys.exit(
        serve({"start": start, "generate": generate, "reset_prefix_cache": reset_prefix_cache, "stop": stop})
    )
