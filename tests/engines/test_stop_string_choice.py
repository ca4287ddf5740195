"""The stop strings the engine tier draws from an answer's text (``workload.stop_string_in``)."""

from __future__ import annotations

from infer_ref.conformance.engines.workloads.prompts import REPLACEMENT_CHARACTER, stop_string_in


def test_a_repeated_piece_after_the_first_character_is_drawn() -> None:
    # "abc" recurs and first stands at index 1: the text expected before it is "x", not empty.
    assert stop_string_in("xabcyabcz") == "abc"
    # At index 0 a piece would leave nothing before it: the 2-character "bc" at index 1 is drawn.
    assert stop_string_in("abcxabc") == "bc"


def test_no_piece_holding_a_replacement_character_is_drawn() -> None:
    # A detokenized answer shows U+FFFD where a token boundary cut a character's bytes in two; no
    # engine generates that text, so an engine matching stop strings on its bytes never stops there
    # (a false alarm, blamed on the stop-string class). The only repeated pieces here hold one.
    text = f"Hi {REPLACEMENT_CHARACTER * 2} there {REPLACEMENT_CHARACTER * 2}"
    assert text.count(f" {REPLACEMENT_CHARACTER * 2}") == 2  # a repeated piece the rule would take without the check
    assert stop_string_in(text) is None
    chosen = stop_string_in(f"a{REPLACEMENT_CHARACTER}bcd{REPLACEMENT_CHARACTER}bcd")
    assert chosen == "bcd" and REPLACEMENT_CHARACTER not in chosen


def test_blank_and_unrepeated_text_give_none() -> None:
    assert stop_string_in("x   y   z") is None  # only blank pieces repeat
    assert stop_string_in("abcdefg") is None
    assert stop_string_in("") is None
