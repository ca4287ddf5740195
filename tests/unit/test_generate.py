"""generate() and sampling with mock models (plus every rejected input)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from infer_ref import ModelConfig, SamplingParams, generate, sample_token
from infer_ref.conformance.checkpoints.snapshots import tiny_config
from infer_ref.sampling import apply_repetition_penalty, filter_top_k_top_p

VOCAB = 16
EOS = 15


def _config(**overrides) -> ModelConfig:
    return ModelConfig.from_hf_dict(tiny_config("llama", vocab_size=VOCAB, eos_token_id=[EOS, 14], **overrides))


def _write_and_advance(kv_cache, t: int) -> None:
    """The cache protocol without a model: every layer writes its ``t`` positions (zeros), then one advance."""
    zeros = torch.zeros(kv_cache.batch_size, kv_cache.num_kv_heads, t, kv_cache.head_dim, dtype=kv_cache.dtype)
    for layer in range(kv_cache.num_layers):
        kv_cache.update(layer, zeros, zeros)
    kv_cache.advance(t)


class TableModel(torch.nn.Module):
    """Next token = table[last input token]; ignores the cache's contents but honours its protocol."""

    def __init__(self, table: dict[int, int], config: ModelConfig | None = None) -> None:
        super().__init__()
        self.table = table
        self.weight = torch.nn.Parameter(torch.zeros(1))
        if config is not None:
            self.config = config
        self.calls: list[int] = []

    def forward(self, input_ids: torch.Tensor, kv_cache=None) -> torch.Tensor:
        self.calls.append(input_ids.shape[1])
        logits = torch.full((1, input_ids.shape[1], VOCAB), -10.0)
        logits[0, -1, self.table.get(int(input_ids[0, -1]), 0)] = 10.0
        if kv_cache is not None:
            _write_and_advance(kv_cache, input_ids.shape[1])
        return logits


class UniformModel(TableModel):
    def forward(self, input_ids: torch.Tensor, kv_cache=None) -> torch.Tensor:
        if kv_cache is not None:
            _write_and_advance(kv_cache, input_ids.shape[1])
        return torch.zeros(1, input_ids.shape[1], VOCAB)


class LetterTokenizer:
    """id i -> letter 'a'+i; ids 14 and 15 are special."""

    eos_token_ids = (EOS,)

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return "".join("" if (skip_special_tokens and i >= 14) else chr(ord("a") + i) for i in ids)


TOK = LetterTokenizer()
CHAIN = {1: 2, 2: 3, 3: 4, 4: 5, 5: 6, 6: 7, 7: 8, 8: 9}


def _greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_new_tokens=n, **kw)


def test_greedy_fixed_token_with_cache() -> None:
    model = TableModel(dict.fromkeys(range(VOCAB), 3), _config())
    result = generate(model, TOK, [1, 2], _greedy(5), device="cpu")
    assert result.token_ids == [3] * 5 and result.finish_reason == "length" and result.text == "ddddd"
    assert model.calls == [2, 1, 1, 1, 1]  # prefill once, then one token per step


def test_uncached_feeds_the_whole_sequence() -> None:
    model = TableModel(CHAIN, _config())
    generate(model, TOK, [1, 2], _greedy(4), device="cpu", use_kv_cache=False)
    assert model.calls == [2, 3, 4, 5]


def test_cached_equals_uncached() -> None:
    a = generate(TableModel(CHAIN, _config()), TOK, [1], _greedy(6), device="cpu", use_kv_cache=True)
    b = generate(TableModel(CHAIN, _config()), TOK, [1], _greedy(6), device="cpu", use_kv_cache=False)
    assert a.token_ids == b.token_ids == [2, 3, 4, 5, 6, 7]
    assert a.text == b.text and a.finish_reason == b.finish_reason


@pytest.mark.parametrize("eos", [15, 14])
def test_every_config_eos_stops(eos: int) -> None:
    model = TableModel({1: 2, 2: 3, 3: eos}, _config())
    result = generate(model, TOK, [1], _greedy(10), device="cpu")
    assert result.token_ids == [2, 3, eos] and result.finish_reason == "eos" and result.text == "cd"


def test_stop_string_truncates_text() -> None:
    model = TableModel(CHAIN, _config())
    result = generate(model, TOK, [1], _greedy(10, stop=("ef",)), device="cpu")
    # tokens 2,3,4,5 decode to "cdef": stop found after the 4th token, text cut before it
    assert result.finish_reason == "stop" and result.text == "cd" and result.token_ids == [2, 3, 4, 5]


def test_timing_fields() -> None:
    result = generate(TableModel(CHAIN, _config()), TOK, [1], _greedy(5), device="cpu")
    assert result.timing.prefill_time_s > 0
    assert len(result.timing.decode_times_s) == result.generated_tokens - 1 == 4
    assert result.timing.total_time_s == pytest.approx(result.timing.prefill_time_s + sum(result.timing.decode_times_s))


def test_max_new_tokens_one() -> None:
    result = generate(TableModel(CHAIN, _config()), TOK, [1], _greedy(1), device="cpu")
    assert result.token_ids == [2] and result.timing.decode_times_s == [] and result.finish_reason == "length"


def test_cache_sized_prompt_plus_new_tokens() -> None:
    config = _config()
    result = generate(TableModel(CHAIN, config), TOK, [1, 1, 1], _greedy(4), device="cpu")
    per_position = 2 * config.num_hidden_layers * config.num_key_value_heads * config.computed_head_dim * 4  # fp32 bytes
    assert result.cache_memory_bytes == per_position * (3 + 4)


def test_seeded_sampling_reproducible_and_cache_independent() -> None:
    params = SamplingParams(temperature=0.8, seed=42, max_new_tokens=20)
    a = generate(UniformModel({}, _config()), TOK, [1], params, device="cpu", use_kv_cache=True)
    b = generate(UniformModel({}, _config()), TOK, [1], params, device="cpu", use_kv_cache=False)
    c = generate(UniformModel({}, _config()), TOK, [1], SamplingParams(temperature=0.8, seed=43, max_new_tokens=20), device="cpu")
    assert a.token_ids == b.token_ids
    assert a.token_ids != c.token_ids


def test_no_config_needs_uncached_mode() -> None:
    with pytest.raises(TypeError, match="must have a .config attribute .* use_kv_cache=False"):
        generate(TableModel(CHAIN), TOK, [1], _greedy(2), device="cpu")
    assert generate(TableModel(CHAIN), TOK, [1], _greedy(2), device="cpu", use_kv_cache=False).token_ids == [2, 3]


def test_runs_on_the_models_device_and_refuses_another() -> None:
    """The runtime takes device and dtype from the model: a ``device`` naming another one is an error
    (nothing is moved, the model is not called), unset or the model's own runs."""
    model = TableModel(CHAIN, _config())
    with pytest.raises(ValueError, match=r"device='meta' but the model's parameters are on cpu"):
        generate(model, TOK, [1], _greedy(2), device="meta")
    assert model.calls == [] and model.weight.device.type == "cpu"
    assert generate(model, TOK, [1], _greedy(2)).token_ids == generate(model, TOK, [1], _greedy(2), device="cpu").token_ids
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            generate(model, TOK, [1], _greedy(2), device="cuda")


def test_the_cache_is_made_on_the_models_device() -> None:
    """A model on the meta device (parameters without storage): its cache is made there, not on the
    default device. (The static caches' meta allocation first imports torch's compiler: seconds.)"""
    from infer_ref.engine.generate import _eager_runner

    model = torch.nn.Linear(1, 1, device="meta")
    for kind in ("contiguous", "dynamic", "paged"):
        runner, kv_cache = _eager_runner(model, _config(), kind, 8, 4)
        assert (runner.device.type, kv_cache.device.type) == ("meta", "meta"), kind


def test_prompt_too_long_for_model() -> None:
    config = _config(max_position_embeddings=8)
    with pytest.raises(ValueError, match=r"prompt \(5 tokens\) \+ max_new_tokens \(4\) = 9 exceeds .* \(8\)"):
        generate(TableModel(CHAIN, config), TOK, [1] * 5, _greedy(4), device="cpu")


def test_empty_prompt() -> None:
    with pytest.raises(ValueError, match="prompt_token_ids is empty"):
        generate(TableModel(CHAIN, _config()), TOK, [], _greedy(2), device="cpu")


def test_streaming_callback_sees_each_token() -> None:
    seen: list[int] = []
    result = generate(TableModel(CHAIN, _config()), TOK, [1], _greedy(3), device="cpu", on_token=seen.append)
    assert seen == result.token_ids


# -- sampling ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"temperature": -0.1}, "temperature must be >= 0"),
        ({"top_k": 0}, "top_k must be a positive integer"),
        ({"top_p": 0.0}, "top_p must be in \\(0, 1\\]"),
        ({"top_p": 1.5}, "top_p must be in \\(0, 1\\]"),
        ({"repetition_penalty": 0.0}, "repetition_penalty must be > 0"),
        ({"max_new_tokens": 0}, "max_new_tokens must be a positive integer"),
        ({"stop": ("",)}, "stop strings must be non-empty"),
    ],
)
def test_bad_sampling_params(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_single_stop_string_is_accepted() -> None:
    assert SamplingParams(stop="x").stop == ("x",)  # type: ignore[arg-type]


def test_repetition_penalty_ctrl_rule() -> None:
    logits = torch.tensor([2.0, -2.0, 1.0, 4.0])
    out = apply_repetition_penalty(logits, [0, 1, 1], 2.0)
    assert out.tolist() == [1.0, -4.0, 1.0, 4.0]  # positive divided, negative multiplied, unseen untouched


def test_top_k_and_top_p_keep_sets() -> None:
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    kept_k = torch.isfinite(filter_top_k_top_p(logits, 2, None)).tolist()
    kept_p = torch.isfinite(filter_top_k_top_p(logits, None, 0.6)).tolist()  # 0.5 < 0.6 <= 0.5+0.3
    assert kept_k == [True, True, False, False]
    assert kept_p == [True, True, False, False]
    assert torch.isfinite(filter_top_k_top_p(logits, None, 0.01)).tolist() == [True, False, False, False]


def test_sampling_follows_softmax_over_temperature() -> None:
    logits = torch.tensor([1.0, 0.0, -1.0])
    params = SamplingParams(temperature=0.5, seed=0)
    generator = params.make_generator()
    draws = torch.tensor([sample_token(logits, [], params, generator) for _ in range(4000)])
    expected = torch.softmax(logits / 0.5, -1)
    observed = torch.bincount(draws, minlength=3).double() / 4000
    assert (observed - expected.double()).abs().max() < 0.03


def test_greedy_is_argmax_after_penalty() -> None:
    logits = torch.tensor([3.0, 2.9, 0.0])
    assert sample_token(logits, [], _greedy(1)) == 0
    assert sample_token(logits, [0], SamplingParams(temperature=0, repetition_penalty=1.5)) == 1


def test_sample_token_needs_1d_logits() -> None:
    with pytest.raises(ValueError, match="logits of shape \\[vocab\\]"):
        sample_token(torch.zeros(1, 3), [], _greedy(1))
