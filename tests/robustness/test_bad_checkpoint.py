"""The loader: corrupt files named, the shard index honoured, dtypes/shapes/names checked, NaN weights refused."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from infer_ref.errors import DataError, NonFiniteError
from infer_ref.loader import CheckpointError, load_model

WEIGHTS = "model.safetensors"
EMBED = "model.embed_tokens.weight"
NORM = "model.layers.0.input_layernorm.weight"


def _edit_state(edit: Callable[[dict[str, torch.Tensor]], None]) -> Callable[[Path], None]:
    def apply(folder: Path) -> None:
        state = load_file(str(folder / WEIGHTS))
        edit(state)
        save_file(state, str(folder / WEIGHTS))

    return apply


def _truncate(folder: Path) -> None:
    data = (folder / WEIGHTS).read_bytes()
    (folder / WEIGHTS).write_bytes(data[: len(data) // 2])


def _header_garbage(folder: Path) -> None:
    (folder / WEIGHTS).write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header}")


def _empty(folder: Path) -> None:
    (folder / WEIGHTS).write_bytes(b"")


def _index_only(folder: Path, weight_map: object, extra: str | None = None) -> None:
    state = load_file(str(folder / WEIGHTS))
    (folder / WEIGHTS).unlink()
    save_file(state, str(folder / "model-00001-of-00001.safetensors"))
    content = extra if extra is not None else json.dumps({"weight_map": weight_map})
    (folder / "model.safetensors.index.json").write_text(content, encoding="utf-8")


def _config(key: str, value: object) -> Callable[[Path], None]:
    def apply(folder: Path) -> None:
        raw = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        raw[key] = value
        (folder / "config.json").write_text(json.dumps(raw), encoding="utf-8")

    return apply


SHARD = "model-00001-of-00001.safetensors"

# (id, how the snapshot is broken, error type, words the message must contain)
CASES: list[tuple[str, Callable[[Path], None], type[Exception], tuple[str, ...]]] = [
    ("truncated-safetensors", _truncate, CheckpointError, ("model.safetensors", "cannot read")),
    ("garbage-header", _header_garbage, CheckpointError, ("model.safetensors",)),
    ("empty-safetensors", _empty, CheckpointError, ("model.safetensors",)),
    ("int-tensor", _edit_state(lambda s: s.__setitem__(NORM, s[NORM].to(torch.int32))), CheckpointError, ("layers.0.input_layernorm.weight", "torch.int32", "non-float")),
    ("bool-tensor", _edit_state(lambda s: s.__setitem__(NORM, s[NORM] > 0)), CheckpointError, ("layers.0.input_layernorm.weight", "torch.bool")),
    ("missing-tensor", _edit_state(lambda s: s.pop(NORM)), CheckpointError, ("missing tensors", "layers.0.input_layernorm.weight")),
    ("unexpected-tensor", _edit_state(lambda s: s.__setitem__("model.layers.9.extra.weight", torch.zeros(2))), CheckpointError, ("unexpected tensors", "layers.9.extra.weight")),
    ("misshaped-tensor", _edit_state(lambda s: s.__setitem__(NORM, torch.ones(127))), CheckpointError, ("layers.0.input_layernorm.weight", "(127,)", "(128,)")),
    ("index-not-json", lambda f: _index_only(f, None, "{nope"), CheckpointError, ("model.safetensors.index.json", "cannot read")),
    ("index-without-weight-map", lambda f: _index_only(f, None, "{}"), CheckpointError, ("weight_map",)),
    ("index-shard-missing", lambda f: _index_only(f, {EMBED: "model-00002-of-00002.safetensors"}), CheckpointError, ("model-00002-of-00002.safetensors", "does not exist")),
    ("index-shard-outside-folder", lambda f: _index_only(f, {EMBED: "../x.safetensors"}), CheckpointError, ("'../x.safetensors'", "shard")),
    ("index-tensor-not-in-its-shard", lambda f: _index_only(f, {"model.ghost.weight": SHARD}), CheckpointError, ("model.ghost.weight", SHARD)),
    ("config-not-json", lambda f: (f / "config.json").write_text("{", encoding="utf-8"), DataError, ("config.json",)),
    ("config-bad-field", _config("num_key_value_heads", 2.5), DataError, ("num_key_value_heads", "2.5")),
    ("no-weights-at-all", lambda f: (f / WEIGHTS).unlink(), FileNotFoundError, ("model.safetensors.index.json", "no model.safetensors")),
]


@pytest.mark.parametrize(("breakage", "error", "words"), [c[1:] for c in CASES], ids=[f"loader-{c[0]}" for c in CASES])
def test_bad_checkpoint_is_refused_naming_the_culprit(
    snapshot: Path, breakage: Callable[[Path], None], error: type[Exception], words: tuple[str, ...]
) -> None:
    breakage(snapshot)
    with pytest.raises(error) as info:
        load_model(snapshot, dtype=torch.float32, device="cpu")
    for word in words:
        assert word in str(info.value), (word, str(info.value))


@pytest.mark.parametrize(
    ("value", "count"), [(float("nan"), "1 of 128"), (float("inf"), "1 of 128"), (float("-inf"), "1 of 128")],
    ids=["loader-nan-weight", "loader-inf-weight", "loader-neg-inf-weight"],
)
def test_non_finite_weight_is_refused_when_checked(snapshot: Path, value: float, count: str) -> None:
    def poison(state: dict[str, torch.Tensor]) -> None:
        state[NORM][5] = value

    _edit_state(poison)(snapshot)
    with pytest.raises(NonFiniteError) as info:
        load_model(snapshot, dtype=torch.float32, device="cpu", check_weights=True)
    assert "layers.0.input_layernorm.weight" in str(info.value) and count in str(info.value)


def test_overflow_on_cast_is_refused_when_checked(snapshot: Path) -> None:
    """A float32 weight of 1e6 is finite, but +inf in float16 (max 65504): checked after the cast."""
    _edit_state(lambda s: s[NORM].__setitem__(0, 1e6))(snapshot)
    load_model(snapshot, dtype=torch.float32, device="cpu", check_weights=True)
    with pytest.raises(NonFiniteError, match="layers.0.input_layernorm.weight"):
        load_model(snapshot, dtype=torch.float16, device="cpu", check_weights=True)


def test_the_index_decides_which_shard_a_tensor_comes_from(snapshot: Path) -> None:
    """A stale copy of a tensor in another shard is never read: the index's shard wins, whatever the file order."""
    state = load_file(str(snapshot / WEIGHTS))
    (snapshot / WEIGHTS).unlink()
    first, second = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    save_file({k: v for k, v in state.items() if k != EMBED}, str(snapshot / first))
    # The second shard holds the embedding (assigned to it) and a stale copy of a first-shard tensor.
    save_file({EMBED: state[EMBED], NORM: torch.full_like(state[NORM], 7.0)}, str(snapshot / second))
    weight_map = {k: (second if k == EMBED else first) for k in state}
    (snapshot / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}), encoding="utf-8")
    model, _ = load_model(snapshot, dtype=torch.float32, device="cpu")
    assert torch.equal(model.layers[0].input_layernorm.weight, state[NORM])
    assert torch.equal(model.embed_tokens.weight, state[EMBED])
