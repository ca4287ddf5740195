"""Generation-stopping properties of ``generate_stopping``, against transformers' ``generate``.

Each example writes a random small checkpoint with a tokenizer (``tokenizer.json``: one two-character
piece per id, decoded by concatenation, so a stop string can span token boundaries) and EOS ids
*inside* the vocabulary, chosen among the tokens the model really produces greedily, so EOS is
forced to occur at a chosen step (the first step included). EOS ids come from every source a
snapshot has: ``config.json`` (a list: every id must be honoured), ``generation_config.json`` and
``tokenizer_config.json``'s ``eos_token`` (Llama 3's end-of-turn token is the classic one missing
from a config). The number of tokens is asserted exactly, not only a prefix.

The protocol (``infer_ref.conformance.interface.adapter``): the returned tokens *include* the EOS id that ended
generation, as transformers returns them, and the token that completed a stop string; the text is
their decoding without special tokens, cut before the earliest occurrence of any stop string.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from infer_ref.conformance import case_models
from infer_ref.conformance import strategies as irst
from infer_ref.conformance.assertions import assert_tokens_equal, fail
from infer_ref.conformance.checkpoints.snapshots import FAMILIES, TINY_INITS, random_state_dict
from infer_ref.conformance.interface.adapter import Adapter
from infer_ref.conformance.oracles.transformers_fp64 import transformers_available, transformers_model

pytestmark = [
    pytest.mark.ir_requires("stopping"),
    pytest.mark.skipif(not transformers_available(), reason="needs transformers (the oracle)"),
]

OUT_OF_VOCAB_EOS = 10_000  # a config EOS id no token reaches, for "no EOS from this source"
FIRST_CHARS, SECOND_CHARS = "abcdefgh .", "xyz\nqrstu-"
MARGIN = 1e-6  # greedy steps closer than this to a tie are not decided by the model: rejected
_FOLDER_IDS = itertools.count()


def piece(token_id: int) -> str:
    """The text of an ordinary token: two characters, distinct for ids below 100."""
    return FIRST_CHARS[token_id % 10] + SECOND_CHARS[(token_id // 10) % 10]


def tokenizer_json(vocab_size: int, special: dict[int, str]) -> str:
    """A ``tokenizers`` WordLevel tokenizer: id -> its piece, or a special token's name; the Fuse
    decoder concatenates pieces, so text runs across token boundaries."""
    from tokenizers import AddedToken, Tokenizer, decoders, models

    vocab = {special.get(i, piece(i)): i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=piece(0)))
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([AddedToken(name, special=True) for _, name in sorted(special.items())])
    return str(tok.to_str())


def decode(ids: list[int], special: dict[int, str]) -> str:
    """The oracle text: the pieces of the non-special ids, concatenated (what the tokenizer file says)."""
    return "".join(piece(i) for i in ids if i not in special)


def write_stopping_snapshot(
    cfg: dict[str, Any],
    state: dict[str, torch.Tensor],
    special: dict[int, str],
    generation_eos: list[int] | None,
    tokenizer_eos: str | None,
) -> Path:
    folder = case_models.write_custom_snapshot(f"stopping_{next(_FOLDER_IDS)}", cfg, state)
    (folder / "tokenizer.json").write_text(tokenizer_json(cfg["vocab_size"], special))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": tokenizer_eos, "bos_token": None}))
    generation: dict[str, Any] = {} if generation_eos is None else {"eos_token_id": generation_eos}
    (folder / "generation_config.json").write_text(json.dumps(generation))
    return folder


def _inputs(prompt: list[int]) -> dict[str, torch.Tensor]:
    """An explicit all-ones attention mask: otherwise transformers masks prompt tokens equal to the pad id."""
    ids = torch.tensor([prompt])
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def greedy_continuation(hf: Any, prompt: list[int], steps: int) -> list[int]:
    """transformers' greedy ``generate`` with no EOS in reach; steps decided by a margin < MARGIN
    are rejected (``assume``), since then the model does not decide the token."""
    from transformers import GenerationConfig

    gen = GenerationConfig(max_new_tokens=steps, do_sample=False, eos_token_id=None, pad_token_id=0, output_scores=True, return_dict_in_generate=True)
    with torch.inference_mode():
        out = hf.generate(**_inputs(prompt), generation_config=gen)
    for scores in out.scores:
        top2 = torch.topk(scores[0], 2).values
        assume(float(top2[0] - top2[1]) > MARGIN)
    return [int(t) for t in out.sequences[0, len(prompt) :]]


def transformers_generate(hf: Any, prompt: list[int], steps: int, eos_ids: list[int]) -> list[int]:
    from transformers import GenerationConfig

    gen = GenerationConfig(max_new_tokens=steps, do_sample=False, eos_token_id=eos_ids, pad_token_id=0)
    with torch.inference_mode():
        out = hf.generate(**_inputs(prompt), generation_config=gen)
    return [int(t) for t in out[0, len(prompt) :]]


@st.composite
def stopping_runs(draw: st.DrawFn, family: str) -> dict[str, Any]:
    """A model case (float32 weights with the tiny init, so continuations vary), a prompt and a
    length limit, and transformers' greedy continuation of that length."""
    case = draw(irst.model_configs(family), label="case")
    vocab = case.hf_config["vocab_size"]
    prompt = draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=8), label="prompt")
    steps = draw(st.integers(1, 12), label="max_new_tokens")
    state = random_state_dict(case.hf_config, case.seed, TINY_INITS[family])
    hf = transformers_model(case.hf_config, state, key=f"stopping {case_models.case_key(case)}")
    return {"case": case, "state": state, "prompt": prompt, "steps": steps, "hf": hf, "greedy": greedy_continuation(hf, prompt, steps)}


def _run(ir_adapter: Adapter, run: dict[str, Any], folder: Path, stop: tuple[str, ...] = ()) -> tuple[list[int], str]:
    assert ir_adapter.load_model is not None and ir_adapter.generate_stopping is not None
    model = ir_adapter.load_model(folder, torch.float64, "cpu")
    return ir_adapter.generate_stopping(model, folder, list(run["prompt"]), run["steps"], stop)


def _eos_case(data: st.DataObject, run: dict[str, Any], sources: list[str]) -> tuple[Path, list[int], dict[int, str], dict[str, Any]]:
    """A snapshot whose EOS id (from one of ``sources``) is the greedy token at a drawn step, and
    transformers' tokens for it: (folder, expected tokens, special tokens, params)."""
    greedy, steps = run["greedy"], run["steps"]
    source = data.draw(st.sampled_from(sources), label="EOS source")
    at_step = data.draw(st.one_of(st.just(0), st.integers(0, steps - 1)), label="EOS step")
    eos = greedy[at_step] if source != "none" else None
    config = dict(run["case"].hf_config)
    other = next(i for i in range(config["vocab_size"]) if i not in greedy)  # an in-vocab EOS never produced
    config["eos_token_id"] = [other, eos] if source == "config" else [OUT_OF_VOCAB_EOS]
    special = {other: "<|end_of_text|>"}
    if eos is not None:
        special[eos] = "<|eot_id|>"
    folder = write_stopping_snapshot(
        config,
        run["state"],
        special,
        generation_eos=[eos] if source == "generation_config" else None,  # type: ignore[list-item]
        tokenizer_eos="<|eot_id|>" if source == "tokenizer" else None,
    )
    eos_ids = [other] + ([eos] if eos is not None else [])
    expected = transformers_generate(run["hf"], run["prompt"], steps, eos_ids)
    params = {"model": run["case"].describe(), "prompt": run["prompt"], "max_new_tokens": steps, "EOS source": source,
              "EOS id": eos, "greedy continuation": greedy}
    if eos is not None and expected[-1] != eos:
        fail(f"oracle check: transformers did not stop on the forced EOS {eos}: {expected}", params=params)
    return folder, expected, special, params


EOS_SOURCES = ["config", "generation_config", "tokenizer"]


@pytest.mark.parametrize("family", FAMILIES)
@given(data=st.data())
def test_every_eos_source_stops_generation_like_transformers(ir_adapter: Adapter, family: str, data: st.DataObject) -> None:
    """An EOS id from config.json (second of a list), generation_config.json or the tokenizer's
    ``eos_token`` ends generation exactly where transformers' ``generate`` with those ids ends it
    (the EOS token included); with no EOS reached, exactly ``max_new_tokens`` tokens.

    Guards: *EOS ignored or only partly honoured*, *one token too many or too few*.
    """
    run = data.draw(stopping_runs(family), label="run")
    folder, expected, special, params = _eos_case(data, run, [*EOS_SOURCES, "none"])
    tokens, text = _run(ir_adapter, run, folder)
    assert_tokens_equal(tokens, expected, what=f"generate_stopping with EOS from {params['EOS source']} vs transformers' generate", params=params)
    if len(tokens) != len(expected):
        fail(f"{len(tokens)} tokens generated, transformers generates exactly {len(expected)}", params=params)
    if text != decode(expected, special):
        fail(f"text {text!r}, expected {decode(expected, special)!r} (EOS not in the text)", params=params)


@pytest.mark.parametrize("family", FAMILIES)
@given(data=st.data())
def test_nothing_is_generated_after_an_eos_from_any_source(ir_adapter: Adapter, family: str, data: st.DataObject) -> None:
    """Whatever its source, an EOS ends generation: the tokens are a prefix of transformers' (which
    end with the EOS), so nothing follows it. Whether the EOS itself is returned, and the length
    limit, are the count's business (the next test), not this one's: no count bug can fail it.

    Guards: *EOS ignored or only partly honoured*.
    """
    run = data.draw(stopping_runs(family), label="run")
    folder, expected, _, params = _eos_case(data, run, EOS_SOURCES)
    tokens, _ = _run(ir_adapter, run, folder)
    if tokens != expected[: len(tokens)] or len(tokens) > len(expected):
        fail(f"tokens {tokens} go on past transformers' {expected}, which end at the EOS {params['EOS id']}", params=params)


@pytest.mark.parametrize("family", FAMILIES)
@given(data=st.data())
def test_the_token_count_is_exact_where_generation_stops(ir_adapter: Adapter, family: str, data: st.DataObject) -> None:
    """Where generation stops, the count is exact: ``max_new_tokens`` tokens with no EOS reached; the
    EOS token included when an EOS ends it; the token containing a stop string (one within a single
    token, so no boundary and no order of a list is involved) included when it ends it. A run that
    does not stop on the EOS or the stop string at all, but runs to ``max_new_tokens``, passes here:
    that is the EOS and stop-string tests' business, so no bug of theirs can fail this one.

    Guards: *one token too many or too few*.
    """
    run = data.draw(stopping_runs(family), label="run")
    greedy, steps = run["greedy"], run["steps"]
    if data.draw(st.booleans(), label="stop string rather than EOS"):
        j = data.draw(st.integers(0, len(greedy) - 1), label="token holding the stop string")
        stop = piece(greedy[j])  # one whole piece: first and second characters come from disjoint sets, so it
        # can only occur as a whole piece, never across a boundary
        folder = write_stopping_snapshot(dict(run["case"].hf_config), run["state"], {}, None, None)
        expected = greedy[: next(n for n in range(1, len(greedy) + 1) if stop in decode(greedy[:n], {}))]
        params = {"model": run["case"].describe(), "prompt": run["prompt"], "max_new_tokens": steps, "stop": stop, "greedy continuation": greedy}
        tokens, _ = _run(ir_adapter, run, folder, (stop,))
    else:
        folder, expected, _, params = _eos_case(data, run, [*EOS_SOURCES, "none"])
        tokens, _ = _run(ir_adapter, run, folder)
    if tokens not in (expected, greedy[:steps]):
        fail(f"{len(tokens)} tokens {tokens}: expected exactly {len(expected)} {expected} (or, not stopped at all, {greedy[:steps]})", params=params)


def _stop_string(text: str, start: int, length: int) -> str:
    return text[start : start + length]


@pytest.mark.parametrize("family", FAMILIES)
@given(data=st.data())
def test_stop_strings_across_token_boundaries_cut_at_the_earliest(ir_adapter: Adapter, family: str, data: st.DataObject) -> None:
    """Stop strings that span token boundaries end generation at the token completing the first one
    to appear, and the text is cut before the earliest occurrence, whatever the order of the list.

    Expected by stated rule on transformers' greedy continuation: the shortest prefix of it whose
    decoded text contains any stop string; its text cut at the smallest index of any of them.

    Guards: *stop strings across token boundaries or out of order*, *one token too many or too few*.
    """
    run = data.draw(stopping_runs(family), label="run")
    greedy = run["greedy"]
    assume(len(greedy) >= 2)
    full = decode(greedy, {})
    # A string across the boundary between tokens j and j+1 (each piece is two characters).
    j = data.draw(st.integers(0, len(greedy) - 2), label="boundary")
    spanning = _stop_string(full, 2 * j + 1, data.draw(st.integers(2, 3), label="length"))
    stops = [spanning]
    second = data.draw(st.sampled_from(["none", "suffix", "elsewhere"]), label="second stop string")
    if second == "suffix":
        # Its own suffix: the same token completes both, and the longer one starts earlier.
        stops.append(spanning[1:])
    elif second == "elsewhere":
        k = data.draw(st.integers(0, len(greedy) - 2), label="second boundary")
        stops.append(_stop_string(full, 2 * k + 1, 2))
    stops = data.draw(st.permutations(stops), label="order")
    folder = write_stopping_snapshot(dict(run["case"].hf_config), run["state"], {}, None, None)
    cut_tokens = next(n for n in range(1, len(greedy) + 1) if any(s in decode(greedy[:n], {}) for s in stops))
    expected_tokens = greedy[:cut_tokens]
    prefix = decode(expected_tokens, {})
    expected_text = prefix[: min(prefix.find(s) for s in stops if s in prefix)]
    params = {"model": run["case"].describe(), "prompt": run["prompt"], "max_new_tokens": run["steps"], "stop": stops,
              "greedy continuation": greedy, "its text": full}
    tokens, text = _run(ir_adapter, run, folder, tuple(stops))
    assert_tokens_equal(tokens, expected_tokens, what="generate_stopping with stop strings vs the stated rule on transformers' greedy tokens", params=params)
    if len(tokens) != len(expected_tokens):
        fail(f"{len(tokens)} tokens generated, expected exactly {len(expected_tokens)}", params=params)
    if text != expected_text:
        fail(f"text {text!r}, expected {expected_text!r} (cut before the earliest stop string)", params=params)
