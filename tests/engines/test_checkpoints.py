"""The engine tier's synthetic checkpoints: loadable by transformers and by infer_ref in both
config.json styles, the two styles one model, every stress present in the file and load-bearing
(misreading it moves the logprobs far beyond an engine's float32 tolerance), greedy steps decided by
clear margins, and folders written deterministically and cached."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open

from infer_ref.conformance.engines.workloads import checkpoints as ck
from infer_ref.conformance.engines.workloads.checkpoints import (
    ENGINE_CHECKPOINTS,
    STYLES,
    EngineCheckpoint,
    Style,
)
from infer_ref.conformance.oracles.float64_definition import lift_float32_casts
from infer_ref.conformance.oracles.transformers_cache import cache_keyword
from infer_ref.conformance.oracles.transformers_fp64 import transformers_model
from infer_ref.conformance.profiles import one_thread
from infer_ref.loader import load_model, read_safetensors

transformers = pytest.importorskip("transformers")
TRANSFORMERS_5 = int(transformers.__version__.split(".")[0]) >= 5
F64 = torch.float64
PROMPT_LEN = 300  # crosses Gemma's window of 40 seven times, and llama3's original context (64) four times
SPECS = {spec.name: spec for spec in ENGINE_CHECKPOINTS}
GEMMA = next(s for s in ENGINE_CHECKPOINTS if s.architecture["model_type"] == "gemma3_text")
LLAMA = next(s for s in ENGINE_CHECKPOINTS if s.architecture["model_type"] == "llama")
# vLLM's float32 logprobs agree with transformers' float64 to about 1e-5 (the engine-tier issue): a
# misread field must move a logprob the engine shows (one of the top 5) by far more than that to be
# caught. Every misreading below moves one by 5 nats or more somewhere on the 300-token prompt
# (measured: from 5.6 for Gemma's global RoPE scaling ignored to 50 for an untied head read as tied;
# Gemma's window off by one 8.1), and a token changed 100 positions back moves the next step's by
# 0.39 (Gemma) and 0.81 (Llama) nats.
MISREAD_MIN_EFFECT = 1e-2


def _styles(style: Style) -> Any:
    return pytest.param(
        style,
        marks=pytest.mark.skipif(
            style == "t5" and not TRANSFORMERS_5, reason="transformers < 5 does not read rope_parameters"
        ),
    )


STYLE_PARAMS = [_styles(s) for s in STYLES]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[tuple[str, str], Path]]:
    with one_thread():  # the module on one thread
        written = ck.write_all(tmp_path_factory.mktemp("engine-checkpoints"))
        yield {(spec.name, style): written.pop(0) for spec in ENGINE_CHECKPOINTS for style in STYLES}


def _prompt(vocab_size: int, length: int, seed: int) -> torch.Tensor:
    return torch.randint(0, vocab_size, (1, length), generator=torch.Generator().manual_seed(seed))


def _config(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "config.json").read_text())


@torch.inference_mode()
def _hf_logprobs(folder: Path, ids: torch.Tensor) -> torch.Tensor:
    """transformers' float64 logprobs with its float32 casts lifted: the kit's float64 oracle."""
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=F64).eval()
    return lift_float32_casts(model, _config(folder))(ids).logits[0].log_softmax(-1)


# -- the two styles -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SPECS)
@pytest.mark.skipif(not TRANSFORMERS_5, reason="transformers < 5 does not read rope_parameters")
def test_both_styles_are_the_same_model_to_transformers(
    folders: dict[tuple[str, str], Path], name: str
) -> None:
    ids = _prompt(_config(folders[name, "t5"])["vocab_size"], PROMPT_LEN, seed=0)
    t4, t5 = (_hf_logprobs(folders[name, style], ids) for style in STYLES)
    assert torch.equal(t4, t5), (
        f"{name}: t4 and t5 configs give different logits (max diff {(t4 - t5).abs().max():.3g})"
    )


@pytest.mark.parametrize("name", SPECS)
def test_each_style_carries_only_its_own_fields(folders: dict[tuple[str, str], Path], name: str) -> None:
    t4, t5 = (_config(folders[name, style]) for style in STYLES)
    gemma = t5["model_type"] == "gemma3_text"
    t4_only = {"rope_theta", "rope_scaling", "torch_dtype"} | (
        {"rope_local_base_freq", "sliding_window_pattern", "cache_implementation"} if gemma else set()
    )
    t5_only = {"rope_parameters", "dtype"} | ({"layer_types"} if gemma else set())
    assert t4_only <= t4.keys() and not t5_only & t4.keys()
    assert t5_only <= t5.keys() and not t4_only & t5.keys()
    if gemma:
        assert set(t5["rope_parameters"]) == {"full_attention", "sliding_attention"}
    assert {k: v for k, v in t4.items() if k not in t4_only} == {
        k: v for k, v in t5.items() if k not in t5_only
    }


def test_a_layer_pattern_that_t4_cannot_express_is_refused() -> None:
    arch = {
        **GEMMA.architecture,
        "layer_types": ["full_attention", "sliding_attention", "sliding_attention", "sliding_attention"],
    }
    spec = EngineCheckpoint("odd-layers", GEMMA.fixture, (), arch, GEMMA.seed, GEMMA.init)
    with pytest.raises(ValueError, match="follow no sliding_window_pattern"):
        ck.config_json(spec, "t4")
    with pytest.raises(ValueError, match="style must be one of t4, t5"):
        ck.config_json(GEMMA, "t6")  # type: ignore[arg-type]


# -- the stresses ---------------------------------------------------------------------------------


def test_the_stresses_are_in_the_files(folders: dict[tuple[str, str], Path]) -> None:
    configs = {key: _config(folder) for key, folder in folders.items()}
    gemma, llama = configs[GEMMA.name, "t5"], configs[LLAMA.name, "t5"]
    window = gemma["sliding_window"]
    assert window % 16 and window % 32, f"window {window} is divided by a block size of 16 or 32"
    assert "sliding_attention" in gemma["layer_types"] and "full_attention" in gemma["layer_types"]
    assert gemma["query_pre_attn_scalar"] != gemma["head_dim"]
    assert gemma["rope_parameters"]["full_attention"]["rope_type"] == "linear"
    assert configs[GEMMA.name, "t4"]["rope_scaling"]["rope_type"] == "linear"
    assert llama["rope_parameters"]["rope_type"] == "llama3"
    assert configs[LLAMA.name, "t4"]["rope_scaling"]["rope_type"] == "llama3"
    assert (
        configs[LLAMA.name, "t4"]["rope_scaling"]["original_max_position_embeddings"]
        < configs[LLAMA.name, "t4"]["max_position_embeddings"]
    )
    # GQA: ratio 4 over several KV heads (so the head-to-KV mapping matters) and ratio 1 here; the
    # fixtures add ratio 2 (llama-tiny and qwen3-tiny).
    ratios = {
        (c["num_attention_heads"] // c["num_key_value_heads"], c["num_key_value_heads"])
        for c in configs.values()
    }
    assert {(4, 2), (1, 4)} <= ratios
    fixture_ratios = {
        c["num_attention_heads"] // c["num_key_value_heads"]
        for c in (_config(p) for p in ck.FIXTURE_CHECKPOINTS.iterdir() if (p / "config.json").is_file())
    }
    assert {1, 2, 4} <= fixture_ratios | {r for r, _ in ratios}
    assert {c["tie_word_embeddings"] for c in configs.values()} == {True, False}
    for (name, style), folder in folders.items():
        config = configs[name, style]
        with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
            names = set(f.keys())
            assert {f.get_tensor(n).dtype for n in names} == {torch.float32}, (
                f"{name}-{style}: not all float32"
            )
        assert ("lm_head.weight" in names) == (not config["tie_word_embeddings"]), (
            f"{name}-{style}: lm_head vs tie flag"
        )
        assert config["max_position_embeddings"] >= 512 and config["hidden_size"] == 64
        # A head size engines have kernels for: vLLM's CPU attention refuses 16 at its first forward.
        assert config["head_dim"] in (32, 64, 128, 256)


def _top_k_effect(right: torch.Tensor, other: torch.Tensor, k: int = 5) -> float:
    """The largest change, at any position, of a logprob among the right model's top k there: what
    an engine's top-k logprobs show the tier (a far-tail logprob moving would be invisible)."""
    top = right.topk(k, dim=-1).indices
    return float((right.gather(-1, top) - other.gather(-1, top)).abs().max())


def _misread(config: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {**json.loads(json.dumps(config)), **changes}


def _gemma_rope(
    config: dict[str, Any], full: dict[str, Any] | None = None, local: dict[str, Any] | None = None
) -> dict[str, Any]:
    params = config["rope_parameters"]
    return _misread(config, rope_parameters={
        "full_attention": full or params["full_attention"], "sliding_attention": local or params["sliding_attention"],
    })  # fmt: skip


# How an engine may misread each stress, as a config that transformers builds (t5 style).
MISREADINGS: dict[str, tuple[EngineCheckpoint, Callable[[dict[str, Any]], dict[str, Any]]]] = {
    "window rounded to a block of 32": (GEMMA, lambda c: _misread(c, sliding_window=32)),
    "window off by one": (GEMMA, lambda c: _misread(c, sliding_window=c["sliding_window"] - 1)),
    "every layer sliding (layer types ignored)": (GEMMA, lambda c: _misread(c, layer_types=["sliding_attention"] * 4)),
    "softmax scale from head_dim": (GEMMA, lambda c: _misread(c, query_pre_attn_scalar=c["head_dim"])),
    "global RoPE scaling ignored": (GEMMA, lambda c: _gemma_rope(c, full={"rope_type": "default", "rope_theta": 1e6})),
    "global RoPE scaling applied to local layers": (
        GEMMA, lambda c: _gemma_rope(c, local={"rope_type": "linear", "factor": 8.0, "rope_theta": 1e4}),
    ),
    "local RoPE base from the global one": (GEMMA, lambda c: _gemma_rope(c, local={"rope_type": "default", "rope_theta": 1e6})),
    "llama3 RoPE scaling ignored": (LLAMA, lambda c: _misread(c, rope_parameters={"rope_type": "default", "rope_theta": 1e4})),
    "head tied to the embedding": (LLAMA, lambda c: _misread(c, tie_word_embeddings=True)),
}  # fmt: skip


@pytest.mark.skipif(not TRANSFORMERS_5, reason="transformers < 5 does not read rope_parameters")
@pytest.mark.parametrize("misreading", MISREADINGS)
def test_each_stress_is_load_bearing(folders: dict[tuple[str, str], Path], misreading: str) -> None:
    """An engine that misreads the field gives logprobs far from the oracle's, so the tier sees it."""
    spec, misread = MISREADINGS[misreading]
    folder = folders[spec.name, "t5"]
    config = _config(folder)
    ids = _prompt(config["vocab_size"], PROMPT_LEN, seed=1)
    state = read_safetensors(folder)

    def logprobs(cfg: dict[str, Any]) -> torch.Tensor:
        weights = {
            k: v for k, v in state.items() if not (cfg["tie_word_embeddings"] and k == "lm_head.weight")
        }
        with torch.inference_mode():
            return (
                transformers_model(cfg, weights, key=json.dumps(cfg, sort_keys=True))(ids)
                .logits[0]
                .log_softmax(-1)
            )

    right = logprobs(config)
    assert torch.equal(right, _hf_logprobs(folder, ids)), (
        "the oracle built from the config differs from from_pretrained"
    )
    effect = _top_k_effect(right, logprobs(misread(config)))
    assert effect > MISREAD_MIN_EFFECT, (
        f"{spec.name}: misreading '{misreading}' moves the logprobs by only {effect:.3g}"
    )


@pytest.mark.parametrize("name", SPECS)
def test_context_beyond_the_window_matters(folders: dict[tuple[str, str], Path], name: str) -> None:
    """A cache that loses or corrupts old positions changes the next logprobs: changing one prompt
    token 100 positions back (beyond Gemma's window: seen by its global layers only) moves them."""
    folder = folders[name, "t5"]
    ids = _prompt(_config(folder)["vocab_size"], 200, seed=2)
    changed = ids.clone()
    changed[0, -100] = (changed[0, -100] + 1) % _config(folder)["vocab_size"]
    effect = _top_k_effect(_hf_logprobs(folder, ids)[-1:], _hf_logprobs(folder, changed)[-1:])
    assert effect > MISREAD_MIN_EFFECT, (
        f"{name}: a token 100 positions back moves the next logprobs by only {effect:.3g}"
    )


# -- loaders --------------------------------------------------------------------------------------


@pytest.mark.parametrize("style", STYLE_PARAMS)
@pytest.mark.parametrize("name", SPECS)
def test_infer_ref_loads_them_and_agrees_with_transformers(
    folders: dict[tuple[str, str], Path], name: str, style: Style
) -> None:
    folder = folders[name, style]
    ids = _prompt(_config(folder)["vocab_size"], PROMPT_LEN, seed=3)
    model, _ = load_model(folder, dtype=F64, device="cpu")
    with torch.inference_mode():
        ours = model(ids)[0].log_softmax(-1)
    diff = float((ours - _hf_logprobs(folder, ids)).abs().max())
    assert diff <= 1e-9, f"{name}-{style}: infer_ref and transformers differ by {diff:.3g} in float64"


@pytest.mark.parametrize("name", SPECS)
def test_vocabulary_and_special_tokens_are_the_tokenizers(
    folders: dict[tuple[str, str], Path], name: str
) -> None:
    folder = folders[name, "t4"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    config = _config(folder)
    assert len(tokenizer) == config["vocab_size"]
    fixture = _config(ck.FIXTURE_CHECKPOINTS / SPECS[name].fixture)
    assert {k: config.get(k) for k in ck.TOKEN_FIELDS} == {k: fixture.get(k) for k in ck.TOKEN_FIELDS}
    generation = json.loads((folder / "generation_config.json").read_text())
    assert generation["eos_token_id"] == config["eos_token_id"]


# -- margins --------------------------------------------------------------------------------------


@torch.inference_mode()
def _greedy_gaps(folder: Path, prompt_len: int, steps: int, seed: int) -> tuple[list[float], list[int]]:
    """Top-2 logprob gap at each greedy step (transformers float64, its own KV cache) and the tokens."""
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=F64).eval()
    ids = _prompt(model.config.vocab_size, prompt_len, seed)
    cache = cache_keyword(model)  # past_key_values or cache, as the installed transformers names it
    out = model(ids, use_cache=True)
    gaps, tokens = [], []
    for _ in range(steps):
        top = out.logits[0, -1].log_softmax(-1).topk(2)
        gaps.append(float(top.values[0] - top.values[1]))
        tokens.append(int(top.indices[0]))
        out = model(top.indices[:1].view(1, 1), use_cache=True, **{cache: getattr(out, cache)})
    return gaps, tokens


@pytest.mark.parametrize("name", SPECS)
def test_greedy_steps_are_decided_by_clear_margins(folders: dict[tuple[str, str], Path], name: str) -> None:
    """Not a near-uniform random model (where every comparison would be a tie): over 2 x 100 greedy
    steps crossing Gemma's window, at most 2% have a top-2 gap below 1e-3 nats (measured: none;
    median gap 1.4 nats for Gemma, 0.43 for Llama), and the continuations are not a short loop
    (measured: 16 and 24 distinct tokens for Gemma, 72 and 86 for Llama)."""
    gaps, distinct = [], []
    # Other prompts than the ones the inits were chosen on (seeds 0 and 1).
    for seed, prompt_len in ((10, 60), (11, 150)):
        g, tokens = _greedy_gaps(folders[name, "t5"], prompt_len, 100, seed)
        gaps += g
        distinct.append(len(set(tokens)))
    near_ties = sum(g < 1e-3 for g in gaps) / len(gaps)
    assert near_ties <= 0.02, f"{name}: {near_ties:.1%} of greedy steps are near-ties"
    assert min(distinct) >= 10, f"{name}: greedy continuations hold only {distinct} distinct tokens"


# -- writing --------------------------------------------------------------------------------------


def _file_bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_writing_is_deterministic(tmp_path: Path) -> None:
    for spec in ENGINE_CHECKPOINTS:
        a = ck.write_checkpoint(spec, tmp_path / "a" / spec.name, "t4")
        b = ck.write_checkpoint(spec, tmp_path / "b" / spec.name, "t4")
        assert _file_bytes(a) == _file_bytes(b)
    assert (
        len(_file_bytes(a)) == 2 + len(ck.TOKENIZER_FILES) + 1
    )  # config, weights, tokenizer files, the record


def test_write_all_keeps_current_folders_and_rewrites_stale_ones(tmp_path: Path) -> None:
    first = ck.write_all(tmp_path)
    assert [p.name for p in first] == [s.folder_name(st) for s in ENGINE_CHECKPOINTS for st in STYLES]
    stamps = {p: os.stat(p / "model.safetensors").st_mtime_ns for p in first}
    assert ck.write_all(tmp_path) == first
    assert {p: os.stat(p / "model.safetensors").st_mtime_ns for p in first} == stamps, (
        "a current folder was rewritten"
    )

    weights = first[0] / "model.safetensors"
    pristine = weights.read_bytes()
    weights.write_bytes(pristine[:-1] + bytes([pristine[-1] ^ 1]))  # a corrupted tensor byte
    record = first[1] / ck.RECORD_FILE
    record.write_text(
        record.read_text().replace('"recipe_sha256": "', '"recipe_sha256": "0')
    )  # an older recipe
    (first[2] / ck.RECORD_FILE).unlink()  # an interrupted write
    ck.write_all(tmp_path)
    assert weights.read_bytes() == pristine
    assert all(
        ck.is_current(s, st, tmp_path / s.folder_name(st)) for s in ENGINE_CHECKPOINTS for st in STYLES
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in first), (
        "staging folders left behind"
    )


def test_unknown_names_are_refused_naming_the_known_ones() -> None:
    assert ck.checkpoint_by_name(GEMMA.name) is GEMMA
    with pytest.raises(KeyError, match=LLAMA.name):
        ck.checkpoint_by_name("gemma3-nope")
