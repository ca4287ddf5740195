"""Public helpers for an adapter whose engine takes prompts as text (it tokenizes them itself) and
answers token texts: the tier speaks token ids, so both directions must be exact.

* :class:`PromptText` turns a request's token ids into the text to send, and only where the
  engine's own tokenizer turns that text back into exactly those ids (the lead it puts before any
  text, its BOS, included). Any other prompt raises
  :class:`~infer_ref.conformance.interface.contract.Unsupported` naming both id lists: the tier
  leaves that request out as unjudgeable (counted in the report), it is never sent changed.
* :class:`AnswerTokens` maps a token text the engine answers back to its id, where exactly one token
  of the checkpoint folder renders to that text (a token's bytes decoded with invalid UTF-8 dropped,
  control tokens empty, as detokenizers usually render them); a text several tokens (or none)
  render to raises ``Unsupported``: its id is not known exactly, so that answer cannot be judged.

The factory (or handle) says ``takes_text_prompts = True``; the tier then draws prompts whose text
the folder's tokenizer gives back (``text_stable.py``), so few are left out. ``docs/adapters.md``
has a complete adapter built on these two.
"""

from __future__ import annotations

from infer_ref.conformance.engines.adapters.openai_text import PromptText, RenderedTokens

AnswerTokens = RenderedTokens  # .to_id(text) -> id, or Unsupported where the text is ambiguous

__all__ = ["AnswerTokens", "PromptText"]
