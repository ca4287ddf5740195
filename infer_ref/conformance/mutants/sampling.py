"""The switchable copies of the sampler and of the greedy loop's stopping rule: the sampling and
stopping mutants, each one knob away from infer_ref's own code."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from infer_ref.cache.contiguous import KVCache
from infer_ref.conformance.interface.adapter import SamplerSpec
from infer_ref.conformance.mutants.knobs import Knobs
from infer_ref.results import GenerationTiming, TokenCollector, first_stop
from infer_ref.sampling import apply_repetition_penalty, filter_top_k_top_p
from infer_ref.tokenizer import Tokenizer

# -- the switchable copy of the sampler -----------------------------------------------------------


def _warp_logits(logits: Tensor, context: list[int], spec: SamplerSpec, knobs: Knobs) -> Tensor:
    """Copy of ``infer_ref.sampling.warp_logits`` (sampling, not greedy) with the sampler knob."""
    logits = apply_repetition_penalty(logits, context, spec.repetition_penalty)
    if knobs.sampler == "top_p_before_temperature":
        return filter_top_k_top_p(logits, spec.top_k, spec.top_p) / spec.temperature
    logits = logits / spec.temperature
    if knobs.sampler == "top_k_strict" and spec.top_k is not None and spec.top_k < logits.shape[-1]:
        # The k indices torch.topk returns, not every token tied with the k-th value.
        keep = torch.zeros_like(logits, dtype=torch.bool).scatter(0, torch.topk(logits, spec.top_k).indices, True)
        return filter_top_k_top_p(logits.masked_fill(~keep, float("-inf")), None, spec.top_p)
    return filter_top_k_top_p(logits, spec.top_k, spec.top_p)


def _sample_draws(logits: Tensor, context: list[int], spec: SamplerSpec, seed: int, num_draws: int, knobs: Knobs) -> list[int]:
    """Copy of the sampling path of ``infer_ref.sampling.sample_token`` from one seeded generator."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    probs = torch.softmax(_warp_logits(logits.float(), context, spec, knobs), dim=-1).cpu()
    if knobs.sampler == "race_inverted":
        # The exponential race argmax(p / q), q ~ Exp(1), written as argmax(p * q): same support,
        # a distribution sharpened towards the likely tokens.
        out = []
        for _ in range(num_draws):
            q = torch.empty_like(probs).exponential_(generator=generator)
            out.append(int((probs * q).argmax()))
        return out
    return [int(torch.multinomial(probs, num_samples=1, generator=generator).item()) for _ in range(num_draws)]


# -- the switchable copy of the stopping rule and the greedy loop ---------------------------------


class _KnobbedCollector(TokenCollector):
    """Copy of ``TokenCollector.accept`` with the stopping knob."""

    def __init__(self, *args: Any, knobs: Knobs, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._knobs = knobs

    def accept(self, token: int) -> bool:
        mode = self._knobs.stopping
        before = self._tokenizer.decode(self.generated, skip_special_tokens=True)
        self.tokens.append(token)
        self.generated.append(token)
        if token in self._eos_ids and mode != "eos_ignored":
            self.finish = "eos"
            if mode == "eos_dropped":  # the EOS token left out of the returned tokens
                self.generated.pop()
            return True
        if self._stop:
            text = self._tokenizer.decode(self.generated, skip_special_tokens=True)
            cut = self._find_stop(text, before, token)
            if cut is not None:
                self._text, self.finish = text[:cut], "stop"
                return True
        if mode == "one_token_too_many":
            return len(self.generated) > self._max_new_tokens  # `>` for `>=`
        return len(self.generated) >= self._max_new_tokens

    def _find_stop(self, text: str, before: str, token: int) -> int | None:
        if self._knobs.stopping == "stop_first_listed":  # the first string of the list that occurs
            return next((text.find(s) for s in self._stop if s in text), None)
        if self._knobs.stopping == "stop_within_token":  # each new token's own text searched alone
            piece = self._tokenizer.decode([token], skip_special_tokens=True)
            hit = first_stop(piece, self._stop)
            return None if hit is None else len(before) + hit
        return first_stop(text, self._stop)


@torch.inference_mode()
def _generate_stopping(
    model: Any, folder: Path, prompt_ids: list[int], max_new_tokens: int, stop: tuple[str, ...], knobs: Knobs
) -> tuple[list[int], str]:
    """Copy of the eager greedy loop of ``engine.generate`` with the knobbed stopping rule."""
    tokenizer = Tokenizer(folder)
    config = model.config
    eos_ids = set(config.eos_token_ids)
    if knobs.stopping != "eos_config_only":  # generation_config.json and tokenizer_config.json too
        eos_ids |= set(tokenizer.eos_token_ids)
    if knobs.stopping == "eos_first_id_only":  # `eos_token_id` read as one int: the first id found
        eos_ids = set((*config.eos_token_ids, *tokenizer.eos_token_ids)[:1])
    param = next(model.parameters())
    cache = KVCache.from_model_config(config, len(prompt_ids) + max_new_tokens + 1, dtype=param.dtype, device=param.device)
    collector = _KnobbedCollector(prompt_ids, tokenizer, max_new_tokens=max_new_tokens, stop=stop, eos_ids=eos_ids, knobs=knobs)
    done = False
    while not done:
        fed = collector.tokens if not collector.generated else collector.tokens[-1:]
        logits = model(torch.tensor([fed], device=param.device), kv_cache=cache)  # [1, 1, V]
        done = collector.accept(int(logits[0, -1].argmax()))
    result = collector.result(GenerationTiming(), None)
    return list(result.token_ids), result.text
