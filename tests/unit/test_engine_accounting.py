"""The engine's own accounting and wiring on the tiny fixtures: counters from the schedule's
arithmetic, forced tokens, EOS from the tokenizer, the hash function and sliding windows it is
given, each against a value stated here or the model's own full forward."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import torch

from infer_ref.config import ModelConfig
from infer_ref.conformance.profiles import one_torch_thread
from infer_ref.engine import SamplingParams, generate
from infer_ref.engine.block_manager import block_hash
from infer_ref.engine.engine import Engine
from infer_ref.engine.generate import check_request
from infer_ref.engine.scheduler import ScheduleStep
from infer_ref.fast.modules import FAST_CLASSES
from infer_ref.loader import load_model
from infer_ref.models import DecoderLM
from infer_ref.results import GenerationTiming
from infer_ref.validation import TokenIdError

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "checkpoints"
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=3)


@pytest.fixture(autouse=True, scope="module")
def _one_thread() -> Iterator[None]:
    yield from one_torch_thread()


@pytest.fixture(scope="module")
def llama() -> tuple[DecoderLM, ModelConfig]:
    return load_model(FIXTURES / "llama-tiny", dtype=torch.float32, device="cpu")


def _has_kernel_modules(model: torch.nn.Module) -> bool:
    """Whether any module was swapped to its kernel-backed class (done only for a CUDA model)."""
    return any(type(m) in FAST_CLASSES.values() for m in model.modules())


class _Decoder:
    """A tokenizer with no text, optionally declaring extra EOS ids."""

    def __init__(self, eos: Sequence[int] = ()) -> None:
        self.eos_token_ids = list(eos)

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return ""


def test_engine_defaults(llama: tuple[DecoderLM, ModelConfig]) -> None:
    model, _ = llama
    engine = Engine(model, num_blocks=4)
    assert (engine.block_size, engine.max_batch, engine.model) == (16, 8, model)
    assert not _has_kernel_modules(model)  # a CPU engine leaves the reference modules alone


def test_counters_of_two_requests_sharing_one_block(llama: tuple[DecoderLM, ModelConfig]) -> None:
    model, _ = llama
    engine = Engine(model, num_blocks=8, block_size=4)
    prompts = [[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 7, 8]]  # request 1 hits request 0's first block
    forced = [[10, 11, 12], [20, 21, 22]]
    # Second call: both requests hit the first block published by the first call.
    for cached, computed in (([0, 4], 6 + 2), ([4, 4], 2 + 2)):  # counters are per call
        results = engine.generate(prompts, GREEDY, forced_tokens=forced)
        assert [r.token_ids for r in results] == forced  # teacher forcing feeds exactly these
        assert [r.num_cached_tokens for r in results] == cached
        stats = engine.stats
        # One prefill each; the first token comes from prefill, the other two from 2 decode steps.
        assert (stats.prefill_forwards, stats.decode_steps, stats.generated_tokens) == (2, 2, 6)
        assert stats.prefill_tokens_computed == computed
        assert stats.schedule == [ScheduleStep((0, 1), ()), ScheduleStep((0, 1), ())]
    for r in results:
        assert isinstance(r.timing, GenerationTiming) and r.timing.prefill_time_s > 0
        assert len(r.timing.decode_times_s) == 2 and r.prompt_tokens == 6 and r.text == ""


def test_preemptions_are_reported_per_request(llama: tuple[DecoderLM, ModelConfig]) -> None:
    model, _ = llama
    # 3 blocks of 2: two 2-token prompts take one block each, then each needs a second block to
    # decode while only one is free: the later request is preempted (never the earlier one).
    engine = Engine(model, num_blocks=3, block_size=2)
    forced = [[10, 11, 12, 13], [20, 21, 22, 23]]
    results = engine.generate([[1, 2], [3, 4]], SamplingParams(temperature=0.0, max_new_tokens=4), forced_tokens=forced)
    assert [r.token_ids for r in results] == forced
    assert results[0].num_preemptions == 0 and results[1].num_preemptions >= 1
    assert sum(r.num_preemptions for r in results) == engine.stats.preemptions


def test_an_eos_id_declared_by_the_tokenizer_ends_the_request(llama: tuple[DecoderLM, ModelConfig]) -> None:
    model, _ = llama
    prompt = [5, 17, 42, 9]
    first = generate(model, _Decoder(), prompt, SamplingParams(temperature=0.0, max_new_tokens=1)).token_ids[0]
    [result] = Engine(model, _Decoder(eos=[first]), num_blocks=4, block_size=4).generate([prompt], GREEDY)
    assert (result.token_ids, result.finish_reason) == ([first], "eos")


def test_the_engine_hashes_with_the_function_it_is_given(llama: tuple[DecoderLM, ModelConfig]) -> None:
    model, _ = llama
    calls: list[int | None] = []

    def recording(parent: int | None, ids: Sequence[int]) -> int:
        calls.append(parent)
        return block_hash(parent, ids)

    engine = Engine(model, num_blocks=8, block_size=4, hash_fn=recording)
    engine.generate([[1, 2, 3, 4, 5, 6]], GREEDY, forced_tokens=[[7, 8, 9]])
    assert calls  # the first block (and the second, once full) was hashed through it


def test_sliding_window_layers_attend_within_their_window() -> None:
    """Gemma-tiny's window is 8: a 20-token prompt's logits through the engine's paged blocks
    equal the model's own full forward (float64), where the mask applies the windows."""
    model, config = load_model(FIXTURES / "gemma3-tiny", dtype=torch.float64, device="cpu")
    assert config.sliding_window == 8
    prompt = [(7 * i + 3) % config.vocab_size for i in range(20)]
    forced = [11, 12, 13]
    [result] = Engine(model, num_blocks=16, block_size=4).generate(
        [prompt], GREEDY, forced_tokens=[forced], keep_logits=True
    )
    full = model(torch.tensor([prompt + forced[:-1]]))[0, len(prompt) - 1 :]  # [3, V]
    assert result.step_logits is not None
    torch.testing.assert_close(result.step_logits, full, atol=1e-9, rtol=1e-9)


def test_generate_accepts_a_request_that_ends_at_max_position_embeddings(llama: tuple[DecoderLM, ModelConfig]) -> None:
    model, config = llama
    prompt = [1] * (config.max_position_embeddings - 2)
    result = generate(model, _Decoder(), prompt, SamplingParams(temperature=0.0, max_new_tokens=2))
    assert len(result.token_ids) >= 1
    assert not _has_kernel_modules(model)  # a CPU run leaves the reference modules alone


def test_check_request_without_a_config_takes_any_int64_id() -> None:
    params = SamplingParams(max_new_tokens=1)
    assert check_request([2**63 - 2, 0], params, None, _Decoder()) == [2**63 - 2, 0]
    with pytest.raises(TokenIdError, match=str(2**63 - 1)):
        check_request([2**63 - 1], params, None, _Decoder())


def test_generate_sizes_a_paged_cache_in_the_block_size_it_is_given(llama: tuple[DecoderLM, ModelConfig]) -> None:
    model, config = llama
    params = SamplingParams(temperature=0.0, max_new_tokens=2)
    result = generate(model, _Decoder(), [1, 2, 3, 4, 5, 6], params, cache="paged", block_size=4)
    # 6 + 2 positions at most: 2 blocks of 4; K and V per position: layers * kv heads * head dim float32s.
    per_position = 2 * config.num_hidden_layers * config.num_key_value_heads * config.computed_head_dim * 4
    assert result.cache_memory_bytes == 2 * 4 * per_position


def test_forced_tokens_end_the_request_whatever_max_new_tokens_and_eos_say(llama: tuple[DecoderLM, ModelConfig]) -> None:
    model, config = llama
    eos = sorted(config.eos_token_ids)[0]
    forced = [eos, 7, eos]  # an EOS id is fed like any other token, and 3 < max_new_tokens
    [result] = Engine(model, num_blocks=4, block_size=4).generate(
        [[1, 2]], SamplingParams(temperature=0.0, max_new_tokens=6), forced_tokens=[forced]
    )
    assert (result.token_ids, result.finish_reason) == (forced, "length")
