"""Chat prompt formats of Llama 3.x, Qwen3 and Gemma 3, rendered as their official templates do.

:func:`render_chat_template` reproduces the message formatting of each family's official Jinja chat
template (the parts without tool calling) in plain Python:

``llama`` (Llama 3.1 / 3.2 Instruct)::

    <|begin_of_text|><|start_header_id|>system<|end_header_id|>\\n\\n
    Cutting Knowledge Date: December 2023\\nToday Date: {date_string}\\n\\n{system text}<|eot_id|>
    <|start_header_id|>{role}<|end_header_id|>\\n\\n{content, stripped}<|eot_id|>   (each message)
    <|start_header_id|>assistant<|end_header_id|>\\n\\n                             (generation prompt)

  The system block is always present; a leading system message fills its text (stripped).
  ``date_string`` defaults to ``"26 Jul 2024"``, the official template's fallback when no
  ``strftime_now`` is available (transformers fills in today's date instead, which would make the
  rendering depend on the clock).

``qwen3`` (ChatML, no default system message)::

    <|im_start|>{role}\\n{content}<|im_end|>\\n                                     (each message)
    <|im_start|>assistant\\n                                                        (generation prompt)
    <think>\\n\\n</think>\\n\\n                                                      (enable_thinking=False)

  Assistant turns before the last user message lose their ``<think>…</think>`` reasoning; an
  assistant turn after it keeps its reasoning in a ``<think>\\n…\\n</think>\\n\\n`` block (always
  when it is the last message), exactly as the official template decides.

``gemma3`` / ``gemma3_text``::

    <bos><start_of_turn>user\\n{content, stripped}<end_of_turn>\\n
    <start_of_turn>model\\n{content, stripped}<end_of_turn>\\n   ...
    <start_of_turn>model\\n                                                         (generation prompt)

  ``assistant`` is rendered as ``model``; a leading system message becomes ``{system}\\n\\n`` in
  front of the first user turn; the remaining turns must alternate user/assistant starting with user.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["DEFAULT_LLAMA_DATE_STRING", "SUPPORTED_MODEL_TYPES", "render_chat_template"]

DEFAULT_LLAMA_DATE_STRING = "26 Jul 2024"

_FAMILY = {"llama": "llama", "qwen3": "qwen3", "gemma3": "gemma3", "gemma3_text": "gemma3"}
SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(_FAMILY)

_OPTIONS: dict[str, dict[str, type]] = {
    "llama": {"date_string": str},
    "qwen3": {"enable_thinking": bool},
    "gemma3": {},
}
_ROLES = ("system", "user", "assistant")


def _check_messages(messages: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise ValueError(
            f"messages must be a list of {{'role': str, 'content': str}} dicts, got {type(messages).__name__}"
        )
    if len(messages) == 0:
        raise ValueError("messages is empty; expected at least one {'role': ..., 'content': ...} message")
    out: list[tuple[str, str]] = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, Mapping):
            raise ValueError(
                f"messages[{i}] is a {type(msg).__name__}; expected a dict with string 'role' and 'content'"
            )
        role, content = msg.get("role"), msg.get("content")
        if not isinstance(role, str) or not isinstance(content, str):
            raise ValueError(
                f"messages[{i}] = {dict(msg)!r}; expected a dict with string 'role' and string 'content'"
            )
        if role not in _ROLES:
            raise ValueError(f"messages[{i}] has unknown role {role!r}; expected one of {list(_ROLES)}")
        out.append((role, content))
    return out


def _render_llama(msgs: list[tuple[str, str]], add_generation_prompt: bool, date_string: str) -> str:
    if msgs[0][0] == "system":
        system, msgs = msgs[0][1].strip(), msgs[1:]
    else:
        system = ""
    parts = [
        "<|begin_of_text|>",
        "<|start_header_id|>system<|end_header_id|>\n\n",
        "Cutting Knowledge Date: December 2023\n",
        f"Today Date: {date_string}\n\n",
        system,
        "<|eot_id|>",
    ]
    for role, content in msgs:
        parts.append(f"<|start_header_id|>{role}<|end_header_id|>\n\n{content.strip()}<|eot_id|>")
    if add_generation_prompt:
        parts.append("<|start_header_id|>assistant<|end_header_id|>\n\n")
    return "".join(parts)


def _render_qwen3(msgs: list[tuple[str, str]], add_generation_prompt: bool, enable_thinking: bool) -> str:
    parts: list[str] = []
    if msgs[0][0] == "system":
        parts.append(f"<|im_start|>system\n{msgs[0][1]}<|im_end|>\n")
    # Index of the last user message that is not a wrapped tool response (the official template's
    # ``last_query_index``; defaults to the last message).
    last_query = len(msgs) - 1
    for i in range(len(msgs) - 1, -1, -1):
        role, content = msgs[i]
        if role == "user" and not (
            content.startswith("<tool_response>") and content.endswith("</tool_response>")
        ):
            last_query = i
            break
    for i, (role, content) in enumerate(msgs):
        if role == "user" or (role == "system" and i != 0):
            parts.append(f"<|im_start|>{role}\n{content}<|im_end|>\n")
        elif role == "assistant":
            reasoning = ""
            if "</think>" in content:
                reasoning = content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
                content = content.split("</think>")[-1].lstrip("\n")
            if i > last_query and (i == len(msgs) - 1 or reasoning):
                parts.append(
                    f"<|im_start|>assistant\n<think>\n{reasoning.strip(chr(10))}\n</think>\n\n"
                    f"{content.lstrip(chr(10))}"
                )
            else:
                parts.append(f"<|im_start|>assistant\n{content}")
            parts.append("<|im_end|>\n")
    if add_generation_prompt:
        parts.append("<|im_start|>assistant\n")
        if not enable_thinking:
            parts.append("<think>\n\n</think>\n\n")
    return "".join(parts)


def _render_gemma3(msgs: list[tuple[str, str]], add_generation_prompt: bool) -> str:
    if msgs[0][0] == "system":
        prefix, turns = msgs[0][1] + "\n\n", msgs[1:]
    else:
        prefix, turns = "", msgs
    if not turns:
        raise ValueError(
            "gemma3: a system message alone has nothing to attach to; expected at least one user "
            "message after it (Gemma 3 folds the system text into the first user turn)"
        )
    parts = ["<bos>"]
    for i, (role, content) in enumerate(turns):
        expected = "user" if i % 2 == 0 else "assistant"
        if role != expected:
            where = "after the optional leading system message " if prefix else ""
            raise ValueError(
                f"gemma3: conversation roles must alternate user/assistant/user/... {where}"
                f"starting with user; turn {i} has role {role!r}, expected {expected!r}"
            )
        name = "model" if role == "assistant" else role
        parts.append(f"<start_of_turn>{name}\n{prefix if i == 0 else ''}{content.strip()}<end_of_turn>\n")
    if add_generation_prompt:
        parts.append("<start_of_turn>model\n")
    return "".join(parts)


def render_chat_template(
    messages: Sequence[Mapping[str, Any]],
    model_type: str,
    *,
    add_generation_prompt: bool = True,
    **options: Any,
) -> str:
    """Render ``messages`` in the chat format of ``model_type``.

    Args:
        messages: ``[{"role": "system" | "user" | "assistant", "content": str}, ...]``.
        model_type: ``"llama"``, ``"qwen3"``, ``"gemma3"`` or ``"gemma3_text"`` (the ``model_type``
            of the checkpoint's config.json).
        add_generation_prompt: append the header that opens the assistant's reply.
        **options: per family — ``llama``: ``date_string`` (str, default ``"26 Jul 2024"``);
            ``qwen3``: ``enable_thinking`` (bool, default ``True``; ``False`` appends an empty
            ``<think>`` block after the generation prompt); ``gemma3``: none.

    Returns:
        The prompt text, including the BOS string for Llama and Gemma. Encode it with
        :meth:`infer_ref.tokenizer.Tokenizer.encode`, which does not add a second BOS.

    Raises:
        ValueError: empty or malformed messages, unknown role, unknown ``model_type``, unknown or
            ill-typed option, or (Gemma) turns that do not alternate user/assistant.
    """
    if model_type not in _FAMILY:
        raise ValueError(
            f"unknown model_type {model_type!r}; supported model types: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    family = _FAMILY[model_type]
    allowed = _OPTIONS[family]
    for key, value in options.items():
        if key not in allowed:
            known = ", ".join(allowed) if allowed else "none"
            raise ValueError(
                f"unknown option {key!r} for model_type {model_type!r}; supported options: {known}"
            )
        if not isinstance(value, allowed[key]):
            raise ValueError(
                f"option {key!r} for model_type {model_type!r} must be a {allowed[key].__name__}, "
                f"got {value!r}"
            )
    if not isinstance(add_generation_prompt, bool):
        raise ValueError(f"add_generation_prompt must be a bool, got {add_generation_prompt!r}")
    msgs = _check_messages(messages)
    if family == "llama":
        return _render_llama(
            msgs, add_generation_prompt, options.get("date_string", DEFAULT_LLAMA_DATE_STRING)
        )
    if family == "qwen3":
        return _render_qwen3(msgs, add_generation_prompt, options.get("enable_thinking", True))
    return _render_gemma3(msgs, add_generation_prompt)
