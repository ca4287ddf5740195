"""render_chat_template against literal strings in each family's official chat format.

The expected strings are written out by hand from the official templates (Llama 3.2 Instruct,
Qwen3, Gemma 3 it); none is produced by the function under test.
"""

from __future__ import annotations

import pytest

from infer_ref.chat import render_chat_template

USER_HI = [{"role": "user", "content": "Hi"}]
TWO_TURNS = [
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": "2 + 3 = 5."},
    {"role": "user", "content": "And 7 + 8?"},
]

# ----------------------------------------------------------------------------------------- llama

LLAMA_SYSTEM_BLOCK = (
    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
    "Cutting Knowledge Date: December 2023\n"
    "Today Date: 26 Jul 2024\n\n"
)


def test_llama_single_user_turn_has_default_system_block() -> None:
    expected = (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
        "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert render_chat_template(USER_HI, "llama") == expected


def test_llama_date_string_option() -> None:
    expected = (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
        "Cutting Knowledge Date: December 2023\nToday Date: 01 Mar 2025\n\n<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert render_chat_template(USER_HI, "llama", date_string="01 Mar 2025") == expected


def test_llama_system_message_fills_system_block_and_is_stripped() -> None:
    messages = [{"role": "system", "content": "  Be brief.\n"}, {"role": "user", "content": "Hi"}]
    expected = (
        LLAMA_SYSTEM_BLOCK + "Be brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert render_chat_template(messages, "llama") == expected


def test_llama_multi_turn_contents_stripped() -> None:
    messages = [
        {"role": "user", "content": " What is 2 + 3?\n"},
        {"role": "assistant", "content": "2 + 3 = 5.  "},
        {"role": "user", "content": "And 7 + 8?"},
    ]
    expected = (
        LLAMA_SYSTEM_BLOCK + "<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2 + 3?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n2 + 3 = 5.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nAnd 7 + 8?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert render_chat_template(messages, "llama") == expected


def test_llama_without_generation_prompt() -> None:
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]
    expected = (
        LLAMA_SYSTEM_BLOCK + "<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
    )
    assert render_chat_template(messages, "llama", add_generation_prompt=False) == expected


# ----------------------------------------------------------------------------------------- qwen3


def test_qwen3_single_user_turn_no_default_system() -> None:
    expected = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert render_chat_template(USER_HI, "qwen3") == expected
    assert render_chat_template(USER_HI, "qwen3", enable_thinking=True) == expected


def test_qwen3_enable_thinking_false_appends_empty_think_block() -> None:
    expected = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert render_chat_template(USER_HI, "qwen3", enable_thinking=False) == expected


def test_qwen3_system_message_and_content_kept_verbatim() -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " Hi "}]
    expected = (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n Hi <|im_end|>\n<|im_start|>assistant\n"
    )
    assert render_chat_template(messages, "qwen3") == expected


def test_qwen3_history_drops_reasoning() -> None:
    messages = [
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": "<think>\nAdd them.\n</think>\n\n2 + 3 = 5."},
        {"role": "user", "content": "And 7 + 8?"},
    ]
    expected = (
        "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n"
        "<|im_start|>assistant\n2 + 3 = 5.<|im_end|>\n"
        "<|im_start|>user\nAnd 7 + 8?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert render_chat_template(messages, "qwen3") == expected
    assert render_chat_template(TWO_TURNS, "qwen3") == expected


def test_qwen3_final_assistant_turn_keeps_think_block() -> None:
    # The official template renders the last assistant message (after the last user query) with
    # its reasoning, and with an empty think block when it has none.
    plain = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]
    assert render_chat_template(plain, "qwen3", add_generation_prompt=False) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHello.<|im_end|>\n"
    )
    reasoned = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "<think>\nGreet back.\n</think>\n\nHello."},
    ]
    assert render_chat_template(reasoned, "qwen3", add_generation_prompt=False) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\nGreet back.\n</think>\n\nHello.<|im_end|>\n"
    )


def test_qwen3_multi_turn_with_empty_think_generation_prompt() -> None:
    expected = (
        "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n"
        "<|im_start|>assistant\n2 + 3 = 5.<|im_end|>\n"
        "<|im_start|>user\nAnd 7 + 8?<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    assert render_chat_template(TWO_TURNS, "qwen3", enable_thinking=False) == expected


# ---------------------------------------------------------------------------------------- gemma3


@pytest.mark.parametrize("model_type", ["gemma3", "gemma3_text"])
def test_gemma3_single_user_turn(model_type: str) -> None:
    expected = "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"
    assert render_chat_template(USER_HI, model_type) == expected


def test_gemma3_assistant_renders_as_model_and_contents_stripped() -> None:
    messages = [
        {"role": "user", "content": "What is 2 + 3?\n"},
        {"role": "assistant", "content": " 2 + 3 = 5."},
        {"role": "user", "content": "And 7 + 8?"},
    ]
    expected = (
        "<bos><start_of_turn>user\nWhat is 2 + 3?<end_of_turn>\n"
        "<start_of_turn>model\n2 + 3 = 5.<end_of_turn>\n"
        "<start_of_turn>user\nAnd 7 + 8?<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    assert render_chat_template(messages, "gemma3_text") == expected


def test_gemma3_system_folded_into_first_user_turn() -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Bye"},
    ]
    expected = (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello.<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    assert render_chat_template(messages, "gemma3") == expected


def test_gemma3_without_generation_prompt() -> None:
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]
    expected = "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n"
    assert render_chat_template(messages, "gemma3", add_generation_prompt=False) == expected


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "assistant", "content": "Hello."}],
        [{"role": "user", "content": "Hi"}, {"role": "user", "content": "Hi again"}],
        [{"role": "system", "content": "S"}, {"role": "assistant", "content": "Hello."}],
        [{"role": "user", "content": "Hi"}, {"role": "system", "content": "S"}],
        [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."},
            {"role": "assistant", "content": "Again."},
        ],
    ],
    ids=["starts-with-assistant", "user-user", "system-then-assistant", "late-system", "assistant-assistant"],
)
def test_gemma3_roles_must_alternate(messages: list[dict[str, str]]) -> None:
    with pytest.raises(ValueError, match=r"alternate user/assistant.*expected '(user|assistant)'"):
        render_chat_template(messages, "gemma3")


def test_gemma3_system_alone_is_an_error() -> None:
    with pytest.raises(ValueError, match="at least one user message"):
        render_chat_template([{"role": "system", "content": "S"}], "gemma3")


# ---------------------------------------------------------------------------------------- errors

ALL_TYPES = ["llama", "qwen3", "gemma3", "gemma3_text"]


@pytest.mark.parametrize("model_type", ALL_TYPES)
def test_empty_messages(model_type: str) -> None:
    with pytest.raises(ValueError, match="messages is empty"):
        render_chat_template([], model_type)


@pytest.mark.parametrize("model_type", ALL_TYPES)
@pytest.mark.parametrize(
    "bad",
    [
        "Hi",
        ("user", "Hi"),
        {"role": "user"},
        {"content": "Hi"},
        {"role": "user", "content": 3},
        {"role": None, "content": "Hi"},
        {"role": "user", "content": ["Hi"]},
    ],
)
def test_malformed_message(model_type: str, bad: object) -> None:
    with pytest.raises(ValueError, match=r"messages\[0\].*expected a dict with string 'role'"):
        render_chat_template([bad], model_type)  # type: ignore[list-item]


@pytest.mark.parametrize("model_type", ALL_TYPES)
def test_messages_not_a_list(model_type: str) -> None:
    with pytest.raises(ValueError, match="messages must be a list"):
        render_chat_template("Hi", model_type)  # type: ignore[arg-type]


@pytest.mark.parametrize("model_type", ALL_TYPES)
@pytest.mark.parametrize("role", ["tool", "ipython", "model", "User", ""])
def test_unknown_role(model_type: str, role: str) -> None:
    messages = [{"role": "user", "content": "Hi"}, {"role": role, "content": "x"}]
    with pytest.raises(ValueError, match=r"messages\[1\] has unknown role .*'system', 'user', 'assistant'"):
        render_chat_template(messages, model_type)


@pytest.mark.parametrize("model_type", ["mistral", "gemma", "gemma2", "qwen2", "Llama", ""])
def test_unknown_model_type_lists_supported(model_type: str) -> None:
    with pytest.raises(ValueError, match=r"unknown model_type .*llama, qwen3, gemma3, gemma3_text"):
        render_chat_template(USER_HI, model_type)


@pytest.mark.parametrize(
    ("model_type", "option"),
    [
        ("llama", "enable_thinking"),
        ("qwen3", "date_string"),
        ("gemma3", "date_string"),
        ("gemma3_text", "enable_thinking"),
        ("llama", "tools"),
    ],
)
def test_unknown_option_for_family(model_type: str, option: str) -> None:
    with pytest.raises(ValueError, match=f"unknown option '{option}' for model_type '{model_type}'"):
        render_chat_template(USER_HI, model_type, **{option: False})


@pytest.mark.parametrize(
    ("model_type", "options"),
    [
        ("llama", {"date_string": 2024}),
        ("qwen3", {"enable_thinking": "no"}),
        ("qwen3", {"enable_thinking": 0}),
    ],
)
def test_option_of_wrong_type(model_type: str, options: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="must be a"):
        render_chat_template(USER_HI, model_type, **options)
