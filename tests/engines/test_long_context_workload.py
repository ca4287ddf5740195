"""The long-context workload's pieces, without running an engine: its checkpoints (released geometry,
what transformers reads from them), its lengths (each boundary of the folder crossed), its starts (a
pool that the pool-edge pair fills exactly, at every block size), its tolerances, its selection
(``--ir-long-context`` runs its tests alone) and the matrix drawing it beside the default workload."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from infer_ref.cli.conformance import check_engine_args, pytest_args
from infer_ref.cli.main import build_parser
from infer_ref.cli.options import UsageError
from infer_ref.config import ModelConfig
from infer_ref.conformance.engines.matrix.tier_runs import long_context_xfails, tier_command
from infer_ref.conformance.engines.mutants import LONG_CONTEXT_BUG_CLASSES, LONG_CONTEXT_MUTANTS
from infer_ref.conformance.engines.verdicts.tolerances import (
    LONG_FLOOR,
    MARGIN,
    MEASURED_LONG_SPREAD,
    MEASURED_SPREAD,
    agreement_tolerance,
    consistency_tolerance,
)
from infer_ref.conformance.engines.workloads.checkpoints import write_all
from infer_ref.conformance.engines.workloads.geometry import options_for
from infer_ref.conformance.engines.workloads.long import (
    BLOCK_SIZES,
    LONG_CHUNK_BUDGET,
    LONG_MAX_MODEL_LEN,
    POOL_BLOCKS,
    POOL_EDGE_BLOCKS,
    REACH,
    long_lengths,
    pool_edge_prompts,
    rope_threshold,
    window_sizes,
)
from infer_ref.conformance.engines.workloads.long_checkpoints import (
    GEMMA3_W512,
    GEMMA3_W1024,
    LLAMA3_ROPE8192,
    LONG_CHECKPOINTS,
    LONG_STYLE,
    QWEN3_LONG,
)
from infer_ref.conformance.engines.workloads.prompts import BLOCK_SIZE, model_facts


@pytest.fixture(scope="module")
def long_folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("long")
    folders = write_all(root, specs=LONG_CHECKPOINTS, styles=(LONG_STYLE,))
    return {spec.name: folder for spec, folder in zip(LONG_CHECKPOINTS, folders, strict=True)}


def test_the_released_geometry_is_what_the_configs_say(long_folders: dict[str, Path]) -> None:
    """What infer_ref's config parser (the same fields transformers reads) makes of each folder."""
    for spec in (GEMMA3_W512, GEMMA3_W1024):
        config = ModelConfig.from_hf_dict(json.loads((long_folders[spec.name] / "config.json").read_text()))
        assert config.layer_types == ("sliding_attention",) * 5 + ("full_attention",)  # pattern 6 (5:1), six layers
        assert config.sliding_window == spec.architecture["sliding_window"]
    assert {GEMMA3_W512.architecture["sliding_window"], GEMMA3_W1024.architecture["sliding_window"]} == {512, 1024}
    llama = json.loads((long_folders[LLAMA3_ROPE8192.name] / "config.json").read_text())
    assert llama["rope_scaling"]["rope_type"] == "llama3" and llama["rope_scaling"]["original_max_position_embeddings"] == 8192
    qwen = json.loads((long_folders[QWEN3_LONG.name] / "config.json").read_text())
    assert qwen["model_type"] == "qwen3" and qwen["max_position_embeddings"] > REACH + 256


def test_lengths_cross_each_boundary_of_the_folder(long_folders: dict[str, Path]) -> None:
    w512 = long_folders[GEMMA3_W512.name]
    assert window_sizes(w512) == [512] and rope_threshold(w512) is None
    assert long_lengths(w512) == [511, 512, 513, 1025, 8191, 8193]
    assert long_lengths(long_folders[GEMMA3_W1024.name]) == [1023, 1024, 1025, 2049, 8191, 8193]
    llama = long_folders[LLAMA3_ROPE8192.name]
    assert rope_threshold(llama) == 8192 and window_sizes(llama) == []
    assert long_lengths(llama) == [8191, 8193]  # R - 1 and R + 1: the generated steps cross R
    for folder in long_folders.values():  # every length sits at a block boundary (within one position of it)
        assert all(min(n % BLOCK_SIZE, BLOCK_SIZE - n % BLOCK_SIZE) <= 1 for n in long_lengths(folder))
    assert max(long_lengths(llama)) // BLOCK_SIZE + 1 == 257  # a block table of 257 blocks of 32


def test_a_qwen3_window_counts_only_when_use_sliding_window_is_set(tmp_path: Path, long_folders: dict[str, Path]) -> None:
    folder = tmp_path / "qwen"
    shutil.copytree(long_folders[QWEN3_LONG.name], folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "sliding_window": 4096}))
    assert window_sizes(folder) == []
    (folder / "config.json").write_text(json.dumps({**config, "sliding_window": 4096, "use_sliding_window": True}))
    assert window_sizes(folder) == [4096]


def test_the_pool_edge_pair_fills_the_stressed_pool_exactly(long_folders: dict[str, Path]) -> None:
    facts = model_facts(long_folders[QWEN3_LONG.name])
    prompts = pool_edge_prompts(facts)
    assert [len(p) for p in prompts] == [b * BLOCK_SIZE for b in POOL_EDGE_BLOCKS]
    assert sum(len(p) for p in prompts) == POOL_BLOCKS * BLOCK_SIZE  # the next token of either needs one block more
    caps = frozenset({"prefix_caching", "chunked_prefill", "kv_budget"})
    stressed = options_for("stressed", "float32", caps, long_context=True)
    assert stressed.kv_cache_tokens == POOL_BLOCKS * BLOCK_SIZE and stressed.block_size == BLOCK_SIZE
    assert stressed.max_num_batched_tokens == LONG_CHUNK_BUDGET and stressed.prefix_caching
    assert stressed.kv_cache_tokens >= LONG_MAX_MODEL_LEN  # one whole request fits (vLLM checks)
    for size in BLOCK_SIZES:  # the same tokens at every block size: exhausted at the same positions
        start = options_for(f"block-{size}", "float32", caps, long_context=True)
        assert start.block_size == size and start.kv_cache_tokens == stressed.kv_cache_tokens
    plain = options_for("plain", "float32", caps, long_context=True)
    assert not plain.prefix_caching and plain.max_num_batched_tokens is None and plain.max_model_len == LONG_MAX_MODEL_LEN
    # An engine without the capabilities gets none of the stresses (ample KV, whole prefill).
    bare = options_for("stressed", "float32", frozenset(), long_context=True)
    assert bare.kv_cache_tokens == plain.kv_cache_tokens and bare.max_num_batched_tokens is None
    assert options_for("stressed", "float32", caps).max_model_len == 256  # the default workload's starts are unchanged


def test_chunk_edges_fall_inside_windows_and_blocks() -> None:
    assert LONG_CHUNK_BUDGET % BLOCK_SIZE and 512 % LONG_CHUNK_BUDGET and LONG_CHUNK_BUDGET % 512 and LONG_CHUNK_BUDGET % 1024


def test_float32_tolerance_grows_with_length_and_others_do_not() -> None:
    assert agreement_tolerance("float32") == agreement_tolerance("float32", 100) == 2e-4  # the default workload's
    assert agreement_tolerance("float32", 8209) == pytest.approx(6e-7 * 8209)
    # twice the largest correct-engine distance measured at that length (2.5e-3, llama3-long)
    assert agreement_tolerance("float32", 8209) >= 2 * 2.5e-3 * 0.98
    assert agreement_tolerance("float64", 8209) == agreement_tolerance("float64")
    assert agreement_tolerance("bfloat16", 8209) == agreement_tolerance("bfloat16")


def test_long_context_consistency_tolerance() -> None:
    vllm = consistency_tolerance("vllm", "float32", long_context=True)
    measured = MEASURED_LONG_SPREAD[("vllm", "float32")]
    assert MEASURED_SPREAD[("vllm", "float32")] == 0.0 and vllm.value == max(LONG_FLOOR, MARGIN * measured) and "long-context" in vllm.source
    assert consistency_tolerance("vllm", "float32").value < vllm.value  # bitwise alike at short lengths: tighter there
    ort = consistency_tolerance("onnxruntime-genai", "float32", long_context=True)  # measured on the default workload only
    assert ("onnxruntime-genai", "float32") not in MEASURED_LONG_SPREAD
    assert ort.value == max(LONG_FLOOR, MARGIN * MEASURED_SPREAD[("onnxruntime-genai", "float32")]) and "default workload" in ort.source
    unknown = consistency_tolerance(None, "float32", long_context=True)
    assert unknown.value == agreement_tolerance("float32") and "no spread measured" in unknown.source


def test_the_cli_passes_long_context_to_the_engine_tier_only() -> None:
    parser = build_parser()
    args = parser.parse_args(["conformance", "--engine", "infer_ref", "--long-context"])
    assert "--ir-long-context" in pytest_args(args, [])
    assert "--ir-long-context" not in pytest_args(parser.parse_args(["conformance", "--engine", "infer_ref"]), [])
    with pytest.raises(UsageError, match="--long-context is a workload of the engine tier"):
        check_engine_args(parser.parse_args(["conformance", "--long-context"]))


def test_the_matrix_runs_the_long_workload_without_the_default_xfails(tmp_path: Path) -> None:
    command = tier_command("vllm", tmp_path, long_context=True)
    assert "--long-context" in command and "--xfails" not in command  # vllm-cpu.txt names default-workload tests
    assert "--xfails" in tier_command("vllm", tmp_path)
    assert long_context_xfails(None) is None and long_context_xfails("vllm-cpu.txt") is None


def test_each_long_context_bug_class_has_a_planted_bug() -> None:
    assert {m.bug_class for m in LONG_CONTEXT_MUTANTS} == set(LONG_CONTEXT_BUG_CLASSES)
    assert all(m.long_context and m.checkpoint in {s.name for s in LONG_CHECKPOINTS} for m in LONG_CONTEXT_MUTANTS)


def test_the_adapter_page_states_the_long_context_starts() -> None:
    """docs/adapters.md tells engine teams what each long-context start passes: the code's values."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "adapters.md").read_text()
    table = page[page.index("| start (`--long-context`)"):]
    table = table[: table.index("\n\n")]
    caps = frozenset({"prefix_caching", "chunked_prefill", "kv_budget", "block_size"})
    plain, stressed = (options_for(k, "float32", caps, long_context=True) for k in ("plain", "stressed"))
    for value in (plain.kv_cache_tokens, stressed.kv_cache_tokens, stressed.max_num_batched_tokens, POOL_BLOCKS,
                  f"max_model_len={plain.max_model_len}", *(f"block-{size}" for size in BLOCK_SIZES)):  # fmt: skip
        assert str(value) in table, f"{value} missing from the page's long-context starts"
