"""transformers' ``generate`` through the engine tier (``--engine transformers``).

One request at a time (``generate`` with ``output_logits``): no batching, no prefix cache, and it
says so. Its logprobs are the log-softmax of the raw logits of each step, as the tier's protocol
defines them; prompt logprobs come from one forward over the prompt. Stop strings go through
transformers' own ``stop_strings`` (with the folder's tokenizer), and the text is cut before the
first occurrence as OpenAI-compatible servers do.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from infer_ref.conformance.engines.logprobs import prompt_logprobs_from, token_logprobs
from infer_ref.conformance.engines.protocol import EngineOptions, EngineOutput, EngineRequest
from infer_ref.conformance.interface.contract import Unsupported
from infer_ref.devices import device_label
from infer_ref.results import first_stop

CAPABILITIES = frozenset(
    {"prompt_logprobs", "seed", "stop_strings", "ignore_eos", "top_k_top_p", "top_logprobs"}
)
TORCH_DTYPES = {
    "float64": torch.float64,
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


class TransformersEngine:
    """An :class:`~infer_ref.conformance.engines.protocol.EngineHandle` over ``model.generate``."""

    capabilities = CAPABILITIES

    def __init__(
        self,
        model_dir: Path,
        options: EngineOptions,
        *,
        device: str = "cpu",
        attn_implementation: str | None = None,
    ) -> None:
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if options.prefix_caching or options.max_num_batched_tokens is not None:
            raise Unsupported("transformers' generate has no prefix cache and no chunked-prefill budget")
        model: Any = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=TORCH_DTYPES[options.dtype], attn_implementation=attn_implementation
        )
        self.model = model.to(device).eval()
        self.device = device
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.eos_ids = generation_eos_ids(self.model)
        attention = self.model.config._attn_implementation
        on = f"{options.dtype} on {device_label(device)}, {attention} attention"
        self.name = f"transformers {transformers.__version__} generate ({on})"

    @torch.inference_mode()
    def generate(self, requests: Sequence[EngineRequest]) -> list[EngineOutput]:
        return [self._one(r) for r in requests]

    def _one(self, r: EngineRequest) -> EngineOutput:
        prompt = torch.tensor([r.prompt], dtype=torch.long, device=self.device)  # [1, T]
        if r.seed is not None:
            torch.manual_seed(r.seed)
        out: Any = self.model.generate(prompt, attention_mask=torch.ones_like(prompt), **self._settings(r))
        tokens = out.sequences[0, prompt.shape[1] :].tolist()
        logits = torch.stack(out.logits)[:, 0]  # [G, V]
        steps = tuple(token_logprobs(logits[i], t, r.logprobs) for i, t in enumerate(tokens))
        text = str(self.tokenizer.decode(tokens, skip_special_tokens=True))
        cut = first_stop(text, r.stop)
        stopped = cut is not None or (not r.ignore_eos and ends_with_eos(tokens, self.eos_ids))
        prompt_lp = None
        if r.prompt_logprobs is not None:
            prompt_lp = prompt_logprobs_from(
                self.model(prompt).logits[0, :-1], r.prompt, r.prompt_logprobs
            )  # [T-1, V]
        return EngineOutput(
            tuple(tokens),
            text if cut is None else text[:cut],
            steps,
            "stop" if stopped else "length",
            prompt_lp,
        )

    def _settings(self, r: EngineRequest) -> dict[str, Any]:
        settings: dict[str, Any] = dict(
            max_new_tokens=r.max_tokens,
            do_sample=not r.greedy,
            output_logits=True,
            return_dict_in_generate=True,
            eos_token_id=[] if r.ignore_eos else self.eos_ids,
            pad_token_id=self.eos_ids[0] if self.eos_ids else 0,
        )
        if not r.greedy:
            settings.update(temperature=r.temperature, top_k=r.top_k or None, top_p=r.top_p)
        if r.stop:
            settings.update(stop_strings=list(r.stop), tokenizer=self.tokenizer)
        return settings

    def reset_prefix_cache(self) -> None:
        raise Unsupported("transformers' generate keeps no prefix cache")

    def stop(self) -> None:
        pass


def generation_eos_ids(model: Any) -> list[int]:
    """The EOS ids generation stops at (the model's ``generation_config``, which transformers fills
    from generation_config.json, else config.json)."""
    eos = model.generation_config.eos_token_id
    return [eos] if isinstance(eos, int) else list(eos or [])


def ends_with_eos(tokens: Sequence[int], eos_ids: Sequence[int]) -> bool:
    return bool(tokens) and tokens[-1] in eos_ids


def start_transformers(
    model_dir: Path, options: EngineOptions, device: str = "cpu", attn_implementation: str | None = None
) -> TransformersEngine:
    """``--engine transformers``: ``AutoModelForCausalLM`` on ``model_dir`` in ``options.dtype``, on
    ``device``, with transformers' ``attn_implementation`` (default: its own choice; ``sdpa``,
    ``eager``, ``flash_attention_2`` where installed)."""
    return TransformersEngine(
        Path(model_dir), options, device=device, attn_implementation=attn_implementation
    )


start_transformers.capabilities = CAPABILITIES  # type: ignore[attr-defined]
