"""A stand-in for *your* engine, so that the adapters beside it run anywhere: a transformers causal
LM decoded one token at a time (no KV cache, no batching), with two APIs an engine may offer —
token ids in and out (:meth:`ToyEngine.complete_ids`), or text in and token *texts* out
(:meth:`ToyEngine.complete_text`, as text-only servers answer). Nothing here knows the kit.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


@dataclass
class Step:
    token: int
    logits: torch.Tensor  # [V] the raw logits the token was chosen from


class ToyEngine:
    def __init__(self, model_dir: Path, dtype: str) -> None:
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        eos = [self.model.config.eos_token_id, self.model.generation_config.eos_token_id]
        self.eos_ids = {int(i) for e in eos if e is not None for i in (e if isinstance(e, list) else [e])}

    @torch.inference_mode()
    def complete_ids(self, prompt: list[int], max_tokens: int, temperature: float, seed: int | None,
                     ignore_eos: bool) -> list[Step]:  # fmt: skip
        ids, steps = list(prompt), []
        generator = torch.Generator().manual_seed(seed) if seed is not None else None
        for _ in range(max_tokens):
            logits = self.model(torch.tensor([ids])).logits[0, -1]  # [V]
            if temperature == 0:
                token = int(logits.argmax())
            else:
                probs = torch.softmax(logits.double() / temperature, dim=-1)
                token = int(torch.multinomial(probs, 1, generator=generator))
            steps.append(Step(token, logits))
            ids.append(token)
            if token in self.eos_ids and not ignore_eos:
                break
        return steps

    def tokenize(self, text: str) -> list[int]:
        """The engine's own tokenization of a prompt text (its BOS first, where the model has one)."""
        return list(self.tokenizer(text).input_ids)

    def complete_text(self, text: str, max_tokens: int, top_n: int) -> list[tuple[str, float, list[tuple[str, float]]]]:
        """Greedy continuation of ``text``: per step the token's text, its logprob and the top ``top_n``
        as (text, logprob). Texts as many detokenizers render them: invalid UTF-8 dropped, control
        tokens by name (``"<end_of_turn>"``)."""
        out = []
        for step in self.complete_ids(self.tokenize(text), max_tokens, 0.0, None, False):
            row = torch.log_softmax(step.logits.double(), dim=-1)
            values, ids = torch.sort(row, descending=True, stable=True)
            top = [(self._render(int(i)), float(v)) for i, v in zip(ids[:top_n], values[:top_n], strict=True)]
            out.append((self._render(step.token), float(row[step.token]), top))
        return out

    def _render(self, token: int) -> str:
        return self.tokenizer.decode([token], skip_special_tokens=False).replace("\ufffd", "")
