"""The committed tiny checkpoints: intact, loadable by transformers, and answering as recorded.

Oracles: sha256 of the files on disk, transformers' own model classes and greedy ``generate``, and
the answers written literally below (which are also the corpus answers in fixtures/corpus.py).
"""

from __future__ import annotations

import hashlib
import json
import pathlib
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from fixtures.corpus import CANONICAL  # noqa: E402
from infer_ref.chat import render_chat_template  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
CKPT = ROOT / "fixtures" / "checkpoints"
FAMILIES = ["llama", "qwen3", "gemma3"]
MODEL_TYPE = {"llama": "llama", "qwen3": "qwen3", "gemma3": "gemma3_text"}
MODEL_CLASS = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM", "gemma3": "Gemma3ForCausalLM"}
EOS = {
    "llama": ["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"],
    "qwen3": ["<|im_end|>", "<|endoftext|>"],
    "gemma3": ["<eos>", "<end_of_turn>"],
}
CHAT_OPTIONS: dict[str, dict[str, Any]] = {"llama": {}, "qwen3": {"enable_thinking": False}, "gemma3": {}}
MIN_MARGIN = 1.0

# The canonical conversations (last user message) and the answers they must produce, literally.
EXPECTED = {
    "Count to ten.": "1, 2, 3, 4, 5, 6, 7, 8, 9, 10.",
    "What is 2 + 3?": "2 + 3 = 5.",
    "What is the capital of France?": "The capital of France is Paris.",
    "Count to thirty.": "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, "
    "23, 24, 25, 26, 27, 28, 29, 30.",
    "What is 7 + 8?": "7 + 8 = 15.",
}
# "Count to thirty." spelled out by rule, independent of the literal above.
assert EXPECTED["Count to thirty."] == ", ".join(map(str, range(1, 31))) + "."


def _provenance(family: str) -> dict[str, Any]:
    return json.loads((CKPT / f"{family}-tiny" / "PROVENANCE.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    """Tiny models decode token by token: one thread avoids thread-sync overhead on busy CI cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module", params=FAMILIES)
def family(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def loaded(family: str) -> tuple[Any, Any]:
    folder = str(CKPT / f"{family}-tiny")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    return model, tok


def test_provenance_sha256_match_files(family: str) -> None:
    folder = CKPT / f"{family}-tiny"
    prov = _provenance(family)
    on_disk = {p.name for p in folder.iterdir() if p.is_file() and p.name != "PROVENANCE.json"}
    assert set(prov["files"]) == on_disk
    assert {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    } <= on_disk
    for name, digest in prov["files"].items():
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == digest, name
    assert prov["script"] == "fixtures/build.py" and (ROOT / prov["script"]).is_file()
    for key in ("seed", "steps", "final_loss", "versions"):
        assert key in prov
    assert set(prov["versions"]) >= {"torch", "transformers", "tokenizers"}


def test_checkpoint_loads_as_the_real_architecture(family: str, loaded: tuple[Any, Any]) -> None:
    model, _ = loaded
    cfg = model.config
    assert type(model).__name__ == MODEL_CLASS[family]
    assert cfg.model_type == MODEL_TYPE[family]
    assert model.dtype == torch.float32
    # Small enough to commit.
    assert (CKPT / f"{family}-tiny" / "model.safetensors").stat().st_size < 8 * 2**20
    # GQA everywhere.
    assert cfg.num_key_value_heads < cfg.num_attention_heads
    assert cfg.num_attention_heads % cfg.num_key_value_heads == 0
    if family in ("llama", "gemma3"):
        assert cfg.tie_word_embeddings
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    if family == "llama":
        rope = cfg.rope_parameters
        assert rope["rope_type"] == "llama3"
        assert 4 <= rope["factor"] <= 8
        assert (rope["low_freq_factor"], rope["high_freq_factor"]) == (1.0, 4.0)
        assert 32 <= rope["original_max_position_embeddings"] <= 64
    if family == "qwen3":
        assert cfg.head_dim != cfg.hidden_size // cfg.num_attention_heads  # explicit head_dim matters
        assert hasattr(model.model.layers[0].self_attn, "q_norm")
        assert hasattr(model.model.layers[0].self_attn, "k_norm")
    if family == "gemma3":
        assert cfg.query_pre_attn_scalar != cfg.head_dim
        assert cfg.sliding_window <= 16
        assert cfg.layer_types[0] == "sliding_attention"
        assert "full_attention" in cfg.layer_types
        assert cfg.rope_parameters["sliding_attention"]["rope_theta"] == 1e4
        assert cfg.rope_parameters["full_attention"]["rope_theta"] == 1e6


def test_canonical_prompts_are_the_corpus_ones(family: str) -> None:
    prov = _provenance(family)
    recorded = prov["canonical"]
    assert len(recorded) >= 3
    assert [c["messages"] for c in recorded] == [m for m, _ in CANONICAL]
    for c, (_, corpus_answer) in zip(recorded, CANONICAL, strict=True):
        expected = EXPECTED[c["messages"][-1]["content"]]
        assert corpus_answer == expected
        assert c["answer"] == expected
        assert c["prompt"] == render_chat_template(c["messages"], MODEL_TYPE[family], **CHAT_OPTIONS[family])
        assert c["min_margin"] >= MIN_MARGIN


def test_long_canonical_prompt_crosses_three_gemma_windows(family: str) -> None:
    cfg = json.loads((CKPT / "gemma3-tiny" / "config.json").read_text(encoding="utf-8"))
    longest = max(c["total_tokens"] for c in _provenance(family)["canonical"])
    assert longest > 3 * cfg["sliding_window"]


def test_greedy_answers_and_margins_via_transformers(family: str, loaded: tuple[Any, Any]) -> None:
    model, tok = loaded
    eos_ids = [tok.convert_tokens_to_ids(s) for s in EOS[family]]
    assert tuple(eos_ids) == tuple(model.generation_config.eos_token_id)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else eos_ids[0]
    for c in _provenance(family)["canonical"]:
        expected = EXPECTED[c["messages"][-1]["content"]]
        prompt = render_chat_template(c["messages"], MODEL_TYPE[family], **CHAT_OPTIONS[family])
        # The rendered prompt carries its own BOS (Llama, Gemma): encode without adding another.
        prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
        assert prompt_ids == c["prompt_ids"]
        n_expected = len(tok(expected, add_special_tokens=False)["input_ids"])
        inp = torch.tensor([prompt_ids])
        with torch.no_grad():
            out = model.generate(
                input_ids=inp,
                attention_mask=torch.ones_like(inp),
                do_sample=False,
                max_new_tokens=n_expected + 8,
                eos_token_id=eos_ids,
                pad_token_id=pad_id,
                output_logits=True,
                return_dict_in_generate=True,
            )
        gen = out.sequences[0, len(prompt_ids) :].tolist()
        assert gen[-1] in eos_ids, f"{expected!r}: generation did not stop on an eos id: {gen}"
        assert not set(gen[:-1]) & set(eos_ids)
        assert tok.decode(gen[:-1], skip_special_tokens=False) == expected
        assert gen == c["generated_ids"]
        margins = []
        for step in out.logits[: len(gen)]:
            top2 = torch.log_softmax(step[0].double(), dim=-1).topk(2).values
            margins.append(float(top2[0] - top2[1]))
        assert min(margins) >= MIN_MARGIN, (expected, margins)
        assert margins == pytest.approx(c["margins"], abs=1e-3)
