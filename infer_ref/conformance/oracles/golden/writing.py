"""Writing golden files with transformers' ``generate`` (the independent oracle), greedy."""

from __future__ import annotations

import platform
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from infer_ref.conformance.oracles.golden.format import (
    DEFAULT_TOP_K,
    DTYPES,
    FORMAT,
    FORMAT_VERSION,
    GOLDEN_DIR,
    seal,
    validate,
)
from infer_ref.conformance.oracles.golden.sources import ModelSource, load_transformers_model, repo_relative
from infer_ref.conformance.oracles.golden.tolerances import tolerance_for


def device_name(device: str | torch.device) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()})"


def run_versions() -> dict[str, str]:
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version()}


def top_logprobs(lp: Tensor, k: int, ndigits: int | None = 6) -> tuple[list[int], list[float]]:
    """Top-k of logprobs ``lp``; exact ties (common with bf16 logits) ordered by id, as argmax orders them."""
    values, ids = lp.topk(min(k + 8, lp.numel()))
    pairs = sorted(zip(ids.tolist(), values.tolist(), strict=True), key=lambda p: (-p[1], p[0]))[:k]
    return [int(i) for i, _ in pairs], [float(v) if ndigits is None else round(float(v), ndigits) for _, v in pairs]


@torch.inference_mode()
def write_golden(
    source: ModelSource,
    *,
    dtype: str,
    device: str,
    top_k: int = DEFAULT_TOP_K,
    max_new_tokens: int | None = None,
    stop_on_eos: bool | None = None,
    progress: Callable[[int], None] | None = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Build a golden document with transformers' ``generate`` (greedy) on ``source``.

    Checkpoints: their canonical prompts, stopping at EOS (``max_new_tokens`` default 64).
    Synthetic models: their seeded prompts, a fixed number of new tokens, EOS ignored.
    ``progress`` is called with the number of tokens generated after each prompt.
    """

    torch_dtype = DTYPES[dtype]
    t0 = time.perf_counter()
    model = load_transformers_model(source, torch_dtype, device)
    _log(log, f"loaded {source.name} into transformers in {time.perf_counter() - t0:.1f}s")
    t0 = time.perf_counter()
    synthetic = source.source == "synthetic"
    stop = (not synthetic) if stop_on_eos is None else stop_on_eos
    eos_ids = [int(t) for t in source.config.eos_token_ids]
    # No EOS at all when stopping is off: generate must not stop or mask anything.
    model.generation_config.eos_token_id = eos_ids if stop else None
    attn = getattr(model.config, "_attn_implementation", "default")
    cases = []
    longest = 0
    for prompt in source.prompts():
        n_new = max_new_tokens or prompt.get("max_new_tokens") or 64
        longest = max(longest, n_new)
        ids = torch.tensor([prompt["prompt_ids"]], dtype=torch.long, device=device)
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=n_new,
            eos_token_id=eos_ids if stop else None,
            pad_token_id=source.config.pad_token_id if source.config.pad_token_id is not None else 0,
            output_logits=True,
            return_dict_in_generate=True,
        )
        generated = out.sequences[0, ids.shape[1] :].tolist()
        steps = []
        for i, token in enumerate(generated):
            lp = torch.log_softmax(out.logits[i][0].to(torch.float64), dim=-1)
            top_ids, top_lps = top_logprobs(lp, top_k)
            if lp[token] < lp.max():
                raise RuntimeError(
                    f"transformers' generate chose token {token} at step {i} of {prompt['name']!r}, which is not "
                    f"the argmax of its raw logits ({top_ids[0]}): a logits processor is active; golden files "
                    "must be plain greedy"
                )
            steps.append({"token": int(token), "top_ids": top_ids, "top_logprobs": top_lps})
        case = {k: v for k, v in prompt.items() if k != "max_new_tokens"}
        case["max_new_tokens"] = n_new
        case["steps"] = steps
        cases.append(case)
        if progress:
            progress(len(generated))
    _log(log, f"generated {sum(len(c['steps']) for c in cases)} tokens in {time.perf_counter() - t0:.1f}s")
    t0 = time.perf_counter()
    model_meta = source.metadata(torch_dtype, device)
    _log(log, f"weights digest in {time.perf_counter() - t0:.1f}s")
    versions = run_versions()
    doc: dict[str, Any] = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "description": (
            "Golden tokens written by transformers (the oracle), greedy. Verify teacher-forced with "
            "`infer-ref golden verify FILE`; regenerate with `infer-ref golden generate` (see run.command)."
        ),
        "model": model_meta,
        "run": {
            "dtype": dtype,
            "device": torch.device(device).type,
            "device_name": device_name(device),
            **versions,
            "generator": (
                f"transformers {versions['transformers']} {type(model).__name__}.generate(do_sample=False, "
                f"output_logits=True), its default DynamicCache, attn_implementation={attn}; logprobs = "
                "log_softmax in float64 of the raw logits"
            ),
            "command": _generate_command(source, dtype, device),
        },
        "sampling": {
            "strategy": "greedy",
            "temperature": 0.0,
            "max_new_tokens": longest,
            "stop_on_eos": stop,
            "eos_token_ids": eos_ids if stop else [],
            "top_k": top_k,
        },
        "tolerance": asdict(tolerance_for(dtype)),
        "cases": cases,
    }
    validate(doc, sealed=False)
    return seal(doc)


def _generate_command(source: ModelSource, dtype: str, device: str) -> str:
    what = f"--checkpoint {repo_relative(source.path)}" if source.path is not None else f"--synthetic {source.name}"
    return f"infer-ref golden generate {what} --dtype {dtype} --device {torch.device(device).type} --force"


def _log(log: Callable[[str], None] | None, message: str) -> None:
    if log is not None:
        log(message)


def default_golden_path(source_name: str, dtype: str, device: str, folder: Path = GOLDEN_DIR) -> Path:
    return folder / f"{source_name}.{torch.device(device).type}-{dtype}.json"
