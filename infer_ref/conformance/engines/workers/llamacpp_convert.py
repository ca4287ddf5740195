"""llama.cpp's own converter (``convert_hf_to_gguf.py``), told the pre-tokenizer it cannot recognise.

``python llamacpp_convert.py SOURCE_TREE PRE_TOKENIZER CONVERTER_ARGS...`` (``-``: none named) runs the
converter of the
llama.cpp source tree ``SOURCE_TREE`` exactly as its command line would, with one change: where its
own recognition of a BPE tokenizer fails (it hashes the tokenizer's output on a test string and
knows only published tokenizers), it names ``PRE_TOKENIZER`` instead of refusing. A tokenizer it
recognises keeps the converter's own answer. Run with the python of a venv that has the
converter's requirements (torch, transformers, the tree's gguf-py).

Standard library and the converter only: infer_ref is not installed in that venv.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path
from typing import Any

NO_PRE_TOKENIZER = "-"


def name_unrecognised_pre_tokenizer(text_model: Any, pre_tokenizer: str) -> None:
    """Wrap ``text_model.get_vocab_base_pre``: its answer, or ``pre_tokenizer`` where it refuses."""
    recognise = text_model.get_vocab_base_pre

    def get_vocab_base_pre(self: object, tokenizer: object) -> str:
        try:
            return str(recognise(self, tokenizer))
        except NotImplementedError:  # "BPE pre-tokenizer was not recognized"
            print(
                f"llamacpp_convert: pre-tokenizer not recognised by the converter; named {pre_tokenizer!r}",
                file=sys.stderr,
            )
            return pre_tokenizer

    text_model.get_vocab_base_pre = get_vocab_base_pre


def main(argv: list[str]) -> int:
    source, pre_tokenizer, *converter_args = argv
    script = Path(source) / "convert_hf_to_gguf.py"
    sys.path[:0] = [
        str(Path(source)),
        str(Path(source) / "gguf-py"),
    ]  # the tree's own gguf, as the script does
    try:
        from conversion.base import TextModel  # where this converter version defines it
    except ImportError as err:
        print(f"missing: {source} has no importable conversion.base.TextModel ({err})", file=sys.stderr)
        return 3
    if pre_tokenizer != NO_PRE_TOKENIZER:
        name_unrecognised_pre_tokenizer(TextModel, pre_tokenizer)
    sys.argv = [str(script), *converter_args]
    runpy.run_path(str(script), run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
