"""Continued conversations for an engine of text prompts, checked without an engine: the first
turns, transformers' own float64 greedy answers to them (what a correct engine answers), and the
continuations built from those, on every kit checkpoint.

A model's greedy answer is often not the tokenizer's own split of its text (on the Gemma 3 and
Llama 3 engine checkpoints, none of the ten first turns' prompt-and-answer round-trips), so a
continuation of the ids as they are cannot be sent as text. It is built from the ids that text
tokenizes to, as a chat server sends an answer back: every turn is continued, every continuation
round-trips, and it holds the first turn's prompt and answer as text, their prompt tokens as ids
(what the prefix cache serves).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from infer_ref.conformance.engines.protocol import EngineOutput, EngineRequest
from infer_ref.conformance.engines.verdicts.oracle import oracle_model
from infer_ref.conformance.engines.workloads.checkpoints import write_all
from infer_ref.conformance.engines.workloads.long import continued_long_turns, first_long_turns, window_sizes
from infer_ref.conformance.engines.workloads.long_checkpoints import LONG_CHECKPOINTS, LONG_STYLE
from infer_ref.conformance.engines.workloads.prompts import (
    ModelFacts,
    continued_turns,
    first_turns,
    model_facts,
)
from infer_ref.conformance.engines.workloads.text_stable import TextStable, common_prefix
from infer_ref.conformance.profiles import one_thread

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "checkpoints"
FAMILIES = ["llama-tiny", "qwen3-tiny", "gemma3-tiny"]
NEEDED_RETOKENIZING: dict[str, int] = {}  # checkpoint -> first turns whose prompt and answer do not round-trip


@pytest.fixture(scope="module")
def engine_folders(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return write_all(tmp_path_factory.mktemp("engine"))


@pytest.fixture(scope="module")
def long_folders(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return write_all(tmp_path_factory.mktemp("long"), specs=LONG_CHECKPOINTS, styles=(LONG_STYLE,))


@torch.inference_mode()
def _oracle_answers(model_dir: Path, first: list[EngineRequest]) -> list[EngineOutput]:
    """transformers' float64 greedy answers, every request run to ``max_tokens`` (EOS ignored)."""
    with one_thread():
        return _greedy_answers(oracle_model(model_dir), first)


def _greedy_answers(model: torch.nn.Module, first: list[EngineRequest]) -> list[EngineOutput]:
    answers = []
    for r in first:
        out = model.generate(torch.tensor([r.prompt]), max_new_tokens=r.max_tokens, min_new_tokens=r.max_tokens,
                             do_sample=False, pad_token_id=0)  # fmt: skip
        answers.append(EngineOutput(tuple(int(t) for t in out[0, len(r.prompt):]), "", (), "length"))
    return answers


def _check(facts: ModelFacts, first: list[EngineRequest], answers: list[EngineOutput], continued: list[EngineRequest],
           left_out: list[str]) -> None:  # fmt: skip
    text = facts.text
    assert text is not None
    assert left_out == [] and len(continued) == len(first)  # every turn continued
    for request, answer, more in zip(first, answers, continued, strict=True):
        history = request.prompt + answer.token_ids
        assert text.round_trips(more.prompt)
        shared = common_prefix(history, more.prompt)
        # the first turn's prompt is served from cache, as ids, but for its last token where the
        # answer's text merges with it (measured: at most that one, on every kit checkpoint)
        assert shared >= len(request.prompt) - 1
        # the first turn and its answer, as text, then the new turn
        sent = text.tokenizer.decode(list(more.prompt), skip_special_tokens=False)
        assert sent.startswith(text.tokenizer.decode(list(history), skip_special_tokens=False))
    NEEDED_RETOKENIZING[facts.name] = sum(not text.round_trips(r.prompt + a.token_ids) for r, a in zip(first, answers, strict=True))


def _default_folders(engine_folders: list[Path]) -> list[Path]:
    return [FIXTURES / f for f in FAMILIES] + engine_folders


def test_every_default_conversation_continues_as_text_on_every_kit_checkpoint(engine_folders: list[Path]) -> None:
    for model_dir in _default_folders(engine_folders):
        facts = model_facts(model_dir, text_prompts=True)
        first = first_turns(facts, ignore_eos=True)
        answers = _oracle_answers(model_dir, first)
        left_out: list[str] = []
        continued = continued_turns(facts, first, answers, ignore_eos=True, left_out=left_out)
        _check(facts, first, answers, continued, left_out)
    # not vacuous: on the engine checkpoints the answers as ids mostly do not round-trip
    gemma, llama = "gemma3-window40-gqa4-qpas20-globalrope-linear-t4", "llama3-ropescaling-mha-untied-t4"
    assert NEEDED_RETOKENIZING[gemma] >= 8 and NEEDED_RETOKENIZING[llama] >= 8, NEEDED_RETOKENIZING


@pytest.mark.slow
def test_every_long_conversation_continues_as_text_past_the_window(long_folders: list[Path]) -> None:
    """The long first turns (past the window, past 8192 positions) continued: the cached part is
    still past the window. About a minute: transformers' float64 answers at 8193 positions."""
    for model_dir in long_folders:
        facts = model_facts(model_dir, text_prompts=True)
        first = first_long_turns(facts, model_dir, ignore_eos=True)
        answers = _oracle_answers(model_dir, first)
        left_out: list[str] = []
        continued = continued_long_turns(facts, first, answers, ignore_eos=True, left_out=left_out)
        _check(facts, first, answers, continued, left_out)
        assert all(len(r.prompt) > max(window_sizes(model_dir), default=0) for r in first)


class _NothingSendable(TextStable):
    """The folder's judge, but for one history whose text gives back neither it nor its re-tokenization."""

    def __init__(self, model_dir: Path, unsendable: tuple[int, ...]) -> None:
        super().__init__(model_dir)
        self.unsendable = unsendable

    def as_sent(self, ids: Sequence[int]) -> tuple[int, ...] | None:
        return None if tuple(ids) == self.unsendable else super().as_sent(ids)


def test_a_turn_that_cannot_be_sent_as_text_is_left_out_with_its_reason() -> None:
    facts = model_facts(FIXTURES / "llama-tiny", text_prompts=True)
    bad, good = first_turns(facts, ignore_eos=True)[:2]
    answer = EngineOutput((5, 6), "", (), "length")
    facts = replace(facts, text=_NothingSendable(FIXTURES / "llama-tiny", (*bad.prompt, 5, 6)))
    left_out: list[str] = []
    continued = continued_turns(facts, [bad, good], [answer, answer], ignore_eos=True, left_out=left_out)
    assert [r.prompt[: len(good.prompt)] for r in continued] == [good.prompt]
    assert left_out == [f"the {len(bad.prompt)}-token prompt and its 2-token answer do not round-trip through text, "
                        "nor do the ids their text tokenizes to"]  # fmt: skip


@pytest.mark.kit_run
def test_a_correct_text_prompt_engine_passes_every_conversation_and_prefix_cache_test(tmp_path: Path) -> None:
    """infer_ref's engine behind a text-prompt front, on the engine checkpoints where continuing a
    conversation used to raise ("its own text does not give it back"): every conversation and
    prefix-cache test judged and passed, none an error."""
    folders = [f for f in write_all(tmp_path / "engine") if f.name.endswith("-t4")]  # Gemma 3 and Llama 3
    report = tmp_path / "r.json"
    here = Path(__file__).resolve().parent
    cmd = [sys.executable, "-m", "infer_ref.cli", "conformance", "--engine", "text_prompt_engines:start", "--report", str(report),
           "-k", "conversation or prefix_cache", *(f"--model-dir={f}" for f in folders)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here.parents[1]), str(here)])}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900)
    counts = json.loads(report.read_text())["totals"]["counts"]
    assert done.returncode == 0, done.stdout[-4000:]
    # per folder: two conversation tests, the warm-vs-cold and the shared-prefix prefix-cache tests
    assert counts["passed"] == 4 * len(folders) and counts["failed"] == 0, counts
    assert "Error" not in done.stdout and "text does not give it back" not in done.stdout, done.stdout[-4000:]
