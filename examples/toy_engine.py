"""A stand-in for *your* engine, so that the adapters beside it run anywhere: a transformers causal
LM decoded one token at a time (transformers' own KV cache, no batching), with two APIs an engine
may offer — token ids in and out (:meth:`ToyEngine.complete_ids`), or text in and each token's raw
bytes out (:meth:`ToyEngine.complete_text`, as OpenAI-style servers answer ``logprobs.content[].bytes``).
Nothing here knows the kit.
"""

from __future__ import annotations

import inspect
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
        # transformers 5 names the KV cache argument ``cache``, 4 ``past_key_values``
        forward = inspect.signature(self.model.forward).parameters
        self.cache_argument = "cache" if "cache" in forward else "past_key_values"

    @torch.inference_mode()
    def complete_ids(self, prompt: list[int], max_tokens: int, temperature: float, seed: int | None,
                     ignore_eos: bool) -> list[Step]:  # fmt: skip
        steps: list[Step] = []
        generator = torch.Generator().manual_seed(seed) if seed is not None else None
        new, cache = list(prompt), None  # the tokens not yet in the cache: the prompt, then each chosen one
        for _ in range(max_tokens):
            out = self.model(torch.tensor([new]), use_cache=True, **{self.cache_argument: cache})
            logits, cache = out.logits[0, -1], out[1]  # [V]; the cache follows the logits in either version
            if temperature == 0:
                token = int(logits.argmax())
            else:
                probs = torch.softmax(logits.double() / temperature, dim=-1)
                token = int(torch.multinomial(probs, 1, generator=generator))
            steps.append(Step(token, logits))
            new = [token]
            if token in self.eos_ids and not ignore_eos:
                break
        return steps

    def tokenize(self, text: str) -> list[int]:
        """The engine's own tokenization of a prompt text (its BOS first, where the model has one)."""
        return list(self.tokenizer(text).input_ids)

    def complete_text(self, text: str, max_tokens: int, top_n: int, ignore_eos: bool = False) -> list[tuple[bytes, float, list[tuple[bytes, float]]]]:
        """Greedy continuation of ``text``: per step the token's bytes, its logprob and the top ``top_n``
        as (bytes, logprob). A control token's bytes are its name (``b"<end_of_turn>"``)."""
        out = []
        for step in self.complete_ids(self.tokenize(text), max_tokens, 0.0, None, ignore_eos):
            row = torch.log_softmax(step.logits.double(), dim=-1)
            values, ids = torch.sort(row, descending=True, stable=True)
            top = [(self._bytes(int(i)), float(v)) for i, v in zip(ids[:top_n], values[:top_n], strict=True)]
            out.append((self._bytes(step.token), float(row[step.token]), top))
        return out

    def _bytes(self, token: int) -> bytes:
        piece = self.tokenizer.convert_ids_to_tokens(token)
        if piece is None:  # a padded vocabulary's id past the tokenizer's: no bytes at all
            return b""
        if token in self.tokenizer.all_special_ids or not all(c in _BYTE_OF for c in piece):
            return piece.encode()
        return bytes(_BYTE_OF[c] for c in piece)  # a byte-level BPE piece: one character per byte


def _byte_level_alphabet() -> dict[str, int]:
    """Byte-level BPE (GPT-2's, Llama 3's) spells each byte as one printable character: printable
    Latin-1 bytes as themselves, the other 68 as U+0100 onwards, in byte order."""
    kept = set(range(0x21, 0x7F)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    moved = iter(range(0x100, 0x200))
    return {(chr(b) if b in kept else chr(next(moved))): b for b in range(256)}


_BYTE_OF = _byte_level_alphabet()
