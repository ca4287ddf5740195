"""Public helpers for an adapter whose engine takes prompts as text (it tokenizes them itself) and
answers token texts: the tier speaks token ids, so both directions must be exact.

* :class:`PromptText` turns a request's token ids into the text to send, and only where the
  engine's own tokenizer turns that text back into exactly those ids (the lead it puts before any
  text, its BOS, included). Any other prompt raises
  :class:`~infer_ref.conformance.interface.contract.Unsupported` naming both id lists: the tier
  leaves that request out as unjudgeable (counted in the report), it is never sent changed.
* :class:`AnswerTokens` maps a token the engine answers back to its id, where exactly one token of
  the checkpoint folder renders to it, in any of three renderings: its text as detokenizers write it
  (invalid UTF-8 dropped, control tokens empty), a control token by its name (``"<end_of_turn>"``),
  or its raw bytes (a ``bytes`` object); a rendering several tokens (or none) share raises
  ``Unsupported``: its id is not known exactly, so that answer cannot be judged.

The factory (or handle) says ``takes_text_prompts = True``; the tier then draws prompts whose text
the folder's tokenizer gives back (``text_stable.py``), so few are left out. ``docs/adapters.md``
has a complete adapter built on these two.
"""

from __future__ import annotations

from infer_ref.conformance.engines.adapters.openai_text import PromptText, RenderedTokens

AnswerTokens = RenderedTokens  # .to_id(text or bytes) -> id, or Unsupported where it is ambiguous

__all__ = ["AnswerTokens", "PromptText"]
