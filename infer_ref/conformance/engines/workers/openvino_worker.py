"""OpenVINO GenAI's continuous-batching pipeline (``ContinuousBatchingPipeline``) behind the subprocess
bridge.

Run with the python of a venv that has openvino-genai. Operations (see ``worker_loop.py``):
``start`` opens the exported model folder with a ``SchedulerConfig`` built from the tier's options
(:func:`scheduler_settings`) and the CPU plugin's precisions set to the engine's dtype
(:func:`plugin_properties`); ``generate`` adds every request to the pipeline and steps it until all
are done (one batch, scheduled by OpenVINO); ``reset_prefix_cache`` opens the pipeline afresh (it
has no call that empties its prefix cache); ``stop``.

What OpenVINO decides itself and is judged: the logits of every position (its IR of the model, as
optimum-intel exported it, and its CPU kernels, paged attention included), greedy and sampled
choices (its sampler, with the request's temperature, top-k, top-p and ``rng_seed``), EOS (the ids
of the exported generation_config.json), stop strings (``stop_strings``, cut from the text), the
detokenizer (openvino_tokenizers' conversion of tokenizer.json), prefix caching, chunked prefill
(``dynamic_split_fuse`` under ``max_num_batched_tokens``) and the KV budget (``num_kv_blocks``).

Logprobs: ``GenerationConfig.logprobs`` returns the chosen token's log-probability only
("currently only single top logprob can be returned"): no alternatives. Prompt logprobs come from
``echo``: one value per prompt position (a placeholder at position 0), then the generated ones.

Standard library, numpy and openvino-genai only: infer_ref is not installed in that venv.
"""

from __future__ import annotations

import sys
from typing import Any

from openvino_capabilities import CAPABILITIES  # always; "prefix_caching" joins when it is on
from worker_loop import NotInstalled, Refused, serve

# The CPU plugin's inference and KV-cache precisions for the tier's dtypes. Set explicitly: the CPU
# plugin's defaults depend on the processor (bf16 inference where it has AMX/AVX512-BF16, a u8 or
# f16 KV cache), and a float32 engine judged at float32 tolerance needs float32 throughout.
# bfloat16: weights exported in fp32 and computed in bf16 (the precision hint), the KV cache in bf16,
# as the CPU plugin runs a bf16 model on processors with AVX512-BF16 or AMX. float16 is refused: the
# CPU plugin computes in f16 only on processors with AVX512-FP16 or AMX-FP16, and elsewhere would
# quietly run another precision than the one judged.
PRECISIONS = {"float32": "f32", "bfloat16": "bf16"}
BLOCK_SIZE = 32  # the CPU plugin's paged-attention block (positions per KV block); not configurable
WHOLE_PREFILL_TOKENS = 8192  # a budget no prompt of the tier reaches: one step prefills a prompt whole
DEFAULT_KV_TOKENS = 64 * BLOCK_SIZE
DEFAULT_SEQS = 256

_engine: dict[str, Any] = {}


def scheduler_settings(options: dict[str, Any]) -> dict[str, Any]:
    """``SchedulerConfig`` fields for the tier's options; refuses what OpenVINO cannot honour."""
    block = options.get("block_size")
    if block is not None and block != BLOCK_SIZE:
        raise Refused(
            f"OpenVINO's CPU paged attention uses KV blocks of {BLOCK_SIZE} positions (block_size {block} "
            "asked)"
        )
    kv_tokens = options.get("kv_cache_tokens") or DEFAULT_KV_TOKENS
    return {
        "enable_prefix_caching": bool(options["prefix_caching"]),
        "max_num_batched_tokens": options.get("max_num_batched_tokens") or WHOLE_PREFILL_TOKENS,
        "dynamic_split_fuse": True,  # a prompt longer than the step budget is prefilled in chunks
        "num_kv_blocks": max(1, kv_tokens // BLOCK_SIZE),
        "max_num_seqs": options.get("max_num_seqs") or DEFAULT_SEQS,
    }


def plugin_properties(dtype: str) -> dict[str, str]:
    if dtype not in PRECISIONS:
        raise Refused(
            f"the OpenVINO adapter runs float32 and bfloat16 (asked {dtype}): the model is exported with "
            "--weight-format fp32 and computed at that inference and KV-cache precision; OpenVINO's CPU "
            "plugin computes float16 only on processors with AVX512-FP16 or AMX-FP16"
        )
    precision = PRECISIONS[dtype]
    return {"INFERENCE_PRECISION_HINT": precision, "KV_CACHE_PRECISION": precision}


def start(args: dict[str, Any]) -> dict[str, Any]:
    try:
        import numpy
        import openvino
        import openvino_genai
    except ImportError as err:
        raise NotInstalled(f"openvino-genai is not importable by {sys.executable}: {err}") from None
    options = args["options"]
    settings, properties = scheduler_settings(options), plugin_properties(options["dtype"])
    _engine.update(
        genai=openvino_genai,
        openvino=openvino,
        numpy=numpy,
        folder=args["exported"],
        settings=settings,
        properties=properties,
        next_id=0,
    )
    _open_pipeline()
    capabilities = [*CAPABILITIES, *(["prefix_caching"] if options["prefix_caching"] else [])]
    return {
        "name": f"OpenVINO GenAI {openvino_genai.__version__.split('-')[0]} "
        "(ContinuousBatchingPipeline, CPU)",
        "capabilities": capabilities,
        "versions": _versions(openvino_genai, openvino, numpy),
        "scheduler": settings,
        "properties": properties,
    }


def _versions(*modules: Any) -> dict[str, str]:
    return {**{m.__name__: m.__version__ for m in modules}, "python": sys.version.split()[0]}


def _open_pipeline() -> None:
    genai = _engine["genai"]
    config = genai.SchedulerConfig()
    for name, value in _engine["settings"].items():
        setattr(config, name, value)
    _engine["pipe"] = genai.ContinuousBatchingPipeline(
        _engine["folder"], config, "CPU", _engine["properties"]
    )


def generation_config(request: dict[str, Any], genai: Any) -> Any:
    """The request as a ``GenerationConfig``."""
    config = genai.GenerationConfig()
    config.max_new_tokens = request["max_tokens"]
    config.ignore_eos = bool(request["ignore_eos"])
    config.logprobs = 1  # the chosen token's; more are "treated as 1"
    config.echo = request["prompt_logprobs"] is not None
    if request["stop"]:
        config.stop_strings = set(request["stop"])
        config.include_stop_str_in_output = False
    if request["temperature"] > 0:
        config.do_sample = True
        config.temperature = request["temperature"]
        config.top_k = request["top_k"] or 0
        config.top_p = request["top_p"]
        if request["seed"] is not None:
            config.rng_seed = request["seed"]
    return config


def generate(args: dict[str, Any]) -> list[dict[str, Any]]:
    pipe, genai, np = _engine["pipe"], _engine["genai"], _engine["numpy"]
    handles = []
    for request in args["requests"]:
        ids = _engine["openvino"].Tensor(np.array([request["prompt"]], dtype=np.int64))
        handles.append(pipe.add_request(_engine["next_id"], ids, generation_config(request, genai)))
        _engine["next_id"] += 1
    while pipe.has_non_finished_requests():
        pipe.step()
    return [
        _answer(request, _only_output(i, handle))
        for i, (request, handle) in enumerate(zip(args["requests"], handles, strict=True))
    ]


def _only_output(index: int, handle: Any) -> Any:
    """The request's one output; a request the pipeline finished without one (status IGNORED: its
    scheduler dropped it) is an error naming the status, not an index error."""
    outputs = handle.read_all()
    if len(outputs) != 1:
        status = str(handle.get_status()).rsplit(".", 1)[-1]
        raise RuntimeError(
            f"request {index}: OpenVINO finished it with status {status} and {len(outputs)} outputs "
            "(one expected): the pipeline answered nothing"
        )
    return outputs[0]


def _answer(request: dict[str, Any], output: Any) -> dict[str, Any]:
    prompt = list(request["prompt"])
    ids, logprobs = list(output.generated_ids), list(output.generated_log_probs)
    prompt_logprobs = None
    if request["prompt_logprobs"] is not None:  # echo: the prompt's ids and logprobs come first
        ids, logprobs, prompt_logprobs = _split_echo(prompt, ids, logprobs)
    finish = "length" if str(output.finish_reason).endswith("LENGTH") else "stop"
    tokenizer = _engine["pipe"].get_tokenizer()
    return {
        "token_ids": ids,
        "text": tokenizer.decode(ids, skip_special_tokens=True) if ids else "",
        "logprobs": [
            {"token": t, "logprob": float(lp), "top": []} for t, lp in zip(ids, logprobs, strict=True)
        ],
        "prompt_logprobs": prompt_logprobs,
        "finish_reason": finish,
        "cached_tokens": None,
    }


def _split_echo(
    prompt: list[int], ids: list[int], logprobs: list[float]
) -> tuple[list[int], list[float], list[Any]]:
    """Generated ids and logprobs, and the prompt's logprobs, from an echoed output.

    The echoed output starts with the whole prompt's ids and one logprob per prompt position
    (position 0 a placeholder); a request whose prompt was partly served from the prefix cache
    gets logprobs for the positions OpenVINO computed only: that is refused as a wrong answer, the
    positions it leaves out cannot be told apart from the generated ones.
    """
    generated = len(ids) - len(prompt)
    if ids[: len(prompt)] != prompt or generated < 0:
        raise RuntimeError(f"echo: the output does not start with the {len(prompt)}-token prompt")
    if len(logprobs) != len(ids):
        raise RuntimeError(
            f"echo returned {len(logprobs) - generated} prompt logprobs for a {len(prompt)}-token prompt "
            f"({len(logprobs)} logprobs for {len(prompt)} prompt + {generated} generated tokens): "
            "the positions served from the prefix cache have none"
        )
    entries = [None] + [
        {"token": t, "logprob": float(lp), "top": []}
        for t, lp in zip(prompt[1:], logprobs[1 : len(prompt)], strict=True)
    ]
    return ids[len(prompt) :], logprobs[len(prompt) :], entries


def reset_prefix_cache(args: dict[str, Any]) -> None:
    _engine.pop("pipe", None)
    _open_pipeline()


def stop(args: dict[str, Any]) -> None:
    _engine.clear()


if __name__ == "__main__":
    sys.exit(
        serve({"start": start, "generate": generate, "reset_prefix_cache": reset_prefix_cache, "stop": stop})
    )
