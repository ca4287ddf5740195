"""infer_ref's own engine behind a text-prompt front (``--ir-engine text_prompt_engines:start`` with
this folder on the path): it declares ``takes_text_prompts`` and refuses any prompt whose text its
tokenizer (the folder's) would not turn back into the same ids, as a text API would compute
another prompt. A correct engine of text prompts, with a prefix cache and cached-token counts."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer

from infer_ref.conformance.engines.adapters.infer_ref_engine import CAPABILITIES, InferRefEngine
from infer_ref.conformance.engines.protocol import EngineOptions, EngineOutput, EngineRequest
from infer_ref.conformance.engines.text_prompts import PromptText


class TextPromptEngine:
    capabilities = CAPABILITIES
    takes_text_prompts = True

    def __init__(self, model_dir: Path, options: EngineOptions) -> None:
        self.engine = InferRefEngine(model_dir, options)
        tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.prompts = PromptText(model_dir, lambda text: tokenizer.encode(text, add_special_tokens=True).ids,
                                  engine="the text-prompt front")  # fmt: skip
        self.name = f"{self.engine.name} behind text prompts"

    def generate(self, requests: Sequence[EngineRequest]) -> list[EngineOutput]:
        for r in requests:
            self.prompts.to_text(r.prompt)  # Unsupported unless its text gives its ids back
        return self.engine.generate(requests)

    def reset_prefix_cache(self) -> None:
        self.engine.reset_prefix_cache()

    def stop(self) -> None:
        self.engine.stop()


def start(model_dir: Path, options: EngineOptions) -> TextPromptEngine:
    return TextPromptEngine(Path(model_dir), options)


start.capabilities = CAPABILITIES  # type: ignore[attr-defined]
start.takes_text_prompts = True  # type: ignore[attr-defined]
