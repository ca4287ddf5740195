"""Golden files: tampering (truncation, removed or duplicated cases, edited tokens, NaN, negative ids)
is refused as GoldenFormatError; writes are atomic and stay inside their folder.

Each tamper is applied to a real golden file as a hand edit would be (the recorded digest is kept).
Where the schema alone can tell (counts, names, ranges, finite values), the same edit is also
refused after re-sealing, i.e. even in a file whose digest was recomputed to match.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from infer_ref.conformance.oracles import golden
from infer_ref.errors import OverwriteRefused, UsageError
from infer_ref.fileio import atomic_write_text, check_file_name

SOURCE = Path(__file__).resolve().parents[2] / "fixtures" / "golden" / "llama-tiny.cpu-float32.json"
VOCAB = 439

Doc = dict[str, Any]


@pytest.fixture(scope="module")
def pristine() -> Doc:
    return golden.load_golden(SOURCE)


def _step(case: int, step: int) -> Callable[[Doc], dict[str, Any]]:
    return lambda d: d["cases"][case]["steps"][step]


def _swap_top(d: Doc) -> None:
    step = d["cases"][0]["steps"][3]
    ids = step["top_ids"]
    ids[0], ids[1] = ids[1], ids[0]
    step["token"] = ids[0]


def _dup_renamed(d: Doc) -> None:
    extra = copy.deepcopy(d["cases"][0])
    extra["name"] = "canonical-extra"
    d["cases"].append(extra)


# (id, edit, words in the message, also refused when re-sealed)
TAMPERS: list[tuple[str, Callable[[Doc], Any], tuple[str, ...], bool]] = [
    ("truncated-to-first-step", lambda d: d["cases"][0].update(steps=d["cases"][0]["steps"][:1]), ("$.cases[0].steps", "1 steps, expected 38"), True),
    ("last-step-removed", lambda d: d["cases"][3]["steps"].pop(), ("$.cases[3].steps", "98 steps, expected 107"), True),
    ("step-added-after-eos", lambda d: d["cases"][1]["steps"].append(copy.deepcopy(d["cases"][1]["steps"][0])), ("$.cases[1].steps", "10 steps, expected 9"), True),
    ("case-removed", lambda d: d["cases"].pop(2), ("$.cases", "4 cases", "written with 5"), False),
    ("all-cases-removed", lambda d: d["cases"].clear(), ("$.cases: empty",), True),
    ("case-duplicated", lambda d: d["cases"].append(copy.deepcopy(d["cases"][0])), ("'canonical-0'", "repeats $.cases[0]"), True),
    ("case-duplicated-renamed", _dup_renamed, ("$.cases", "6 cases", "written with 5"), False),
    ("token-edited", lambda d: _step(0, 3)(d).update(token=_step(0, 3)(d)["top_ids"][1]), ("$.cases[0].steps[3].token", "not the first of top_ids"), True),
    ("token-edited-consistently", _swap_top, ("$.integrity.sha256", "edited"), False),
    ("logprob-edited", lambda d: _step(0, 2)(d)["top_logprobs"].__setitem__(4, -0.5), ("$.cases[0].steps[2].top_logprobs",), True),
    ("logprob-small-edit", lambda d: _step(0, 2)(d)["top_logprobs"].__setitem__(9, _step(0, 2)(d)["top_logprobs"][9] - 1e-6), ("$.integrity.sha256",), False),
    ("logprob-nan", lambda d: _step(1, 0)(d)["top_logprobs"].__setitem__(0, math.nan), ("$.cases[1].steps[0].top_logprobs", "non-finite"), True),
    ("logprobs-all-nan", lambda d: _step(1, 0)(d).update(top_logprobs=[math.nan] * 10), ("non-finite",), True),
    ("logprob-inf", lambda d: _step(1, 1)(d)["top_logprobs"].__setitem__(9, -math.inf), ("$.cases[1].steps[1].top_logprobs", "non-finite"), True),
    ("logprob-positive", lambda d: _step(1, 1)(d)["top_logprobs"].__setitem__(0, 0.5), ("$.cases[1].steps[1].top_logprobs", "<= 0"), True),
    ("token-negative", lambda d: _step(0, 0)(d).update(token=-1), ("$.cases[0].steps[0].token", "-1"), True),
    ("top-id-negative", lambda d: _step(0, 0)(d)["top_ids"].__setitem__(5, -3), ("$.cases[0].steps[0].top_ids[5]", "-3"), True),
    ("prompt-id-negative", lambda d: d["cases"][2]["prompt_ids"].__setitem__(1, -7), ("$.cases[2].prompt_ids[1]", "-7"), True),
    ("prompt-id-out-of-vocab", lambda d: d["cases"][2]["prompt_ids"].__setitem__(0, VOCAB), ("$.cases[2].prompt_ids[0]", str(VOCAB), f"[0, {VOCAB})"), True),
    ("top-id-out-of-vocab", lambda d: _step(0, 1)(d)["top_ids"].__setitem__(9, 10**6), ("$.cases[0].steps[1].top_ids[9]", str(10**6)), True),
    ("prompt-emptied", lambda d: d["cases"][0].update(prompt_ids=[]), ("$.cases[0].prompt_ids: empty",), True),
    ("top-k-short", lambda d: (_step(0, 1)(d)["top_ids"].pop(), _step(0, 1)(d)["top_logprobs"].pop()), ("$.cases[0].steps[1]", "9 top-k entries", "top_k = 10"), True),
    ("top-k-lengths-differ", lambda d: _step(0, 1)(d)["top_ids"].pop(), ("equally long",), True),
    ("top-ids-repeated", lambda d: _step(0, 1)(d)["top_ids"].__setitem__(3, _step(0, 1)(d)["top_ids"][2]), ("$.cases[0].steps[1].top_ids", "repeated"), True),
    ("token-a-string", lambda d: _step(0, 1)(d).update(token="7"), ("$.cases[0].steps[1].token", "expected int"), True),
    ("max-new-tokens-raised", lambda d: d["cases"][0].update(max_new_tokens=10_000), ("$.cases[0].max_new_tokens", "10000"), True),
    ("description-edited", lambda d: d.update(description="edited"), ("$.integrity.sha256",), False),
    ("hf-config-edited", lambda d: d["model"]["hf_config"].update(rms_norm_eps=1e-3), ("$.integrity.sha256",), False),
    ("hf-config-broken", lambda d: d["model"]["hf_config"].update(num_key_value_heads=2.5), ("$.model.hf_config", "num_key_value_heads"), True),
    ("integrity-removed", lambda d: d.pop("integrity"), ("$.integrity: missing",), False),
    ("digest-edited", lambda d: d["integrity"].update(sha256="0" * 64), ("$.integrity.sha256",), False),
    ("integrity-counts-edited", lambda d: d["integrity"].update(cases=6), ("written with 6",), False),
    ("format-version-1", lambda d: d.update(format_version=1), ("format_version 1", f"reads version {golden.FORMAT_VERSION}"), True),
    ("synthetic-init-garbage", lambda d: d["model"].update(source="synthetic", synthetic={"seed": "x"}), ("$.model.synthetic.seed",), True),
]


def _write(tmp_path: Path, doc: Doc) -> Path:
    path = tmp_path / "tampered.json"
    path.write_text(json.dumps(doc), encoding="utf-8")  # NaN and inf written as JSON's NaN / Infinity
    return path


@pytest.mark.parametrize(("edit", "words", "_"), [c[1:] for c in TAMPERS], ids=[f"golden-{c[0]}" for c in TAMPERS])
def test_tampered_golden_is_refused(pristine: Doc, tmp_path: Path, edit: Callable[[Doc], Any], words: tuple[str, ...], _: bool) -> None:
    doc = copy.deepcopy(pristine)
    edit(doc)
    path = _write(tmp_path, doc)
    with pytest.raises(golden.GoldenFormatError) as info:
        golden.load_golden(path)
    message = str(info.value)
    assert str(path) in message
    for word in words:
        assert word in message, (word, message)


@pytest.mark.parametrize(
    ("edit", "words"), [c[1:3] for c in TAMPERS if c[3]], ids=[f"golden-resealed-{c[0]}" for c in TAMPERS if c[3]]
)
def test_schema_refuses_it_even_with_a_matching_digest(
    pristine: Doc, tmp_path: Path, edit: Callable[[Doc], Any], words: tuple[str, ...]
) -> None:
    doc = copy.deepcopy(pristine)
    edit(doc)
    doc["integrity"] = {"cases": len(doc["cases"]), "steps_per_case": [len(c["steps"]) for c in doc["cases"]], "sha256": ""}
    doc["integrity"]["sha256"] = golden.content_digest(doc)
    with pytest.raises(golden.GoldenFormatError) as info:
        golden.load_golden(_write(tmp_path, doc))
    for word in words:
        assert word in str(info.value)


def test_the_untouched_file_loads(pristine: Doc, tmp_path: Path) -> None:
    """The control: the same file written the same way, without an edit, is accepted."""
    assert golden.load_golden(_write(tmp_path, copy.deepcopy(pristine))) == pristine


@pytest.mark.parametrize(
    ("content", "words"),
    [(b"", ("not valid JSON",)), (b"\xff\xfe\x00", ("not UTF-8",)), (b"[1, 2]", ("is not a golden file",)), (b'{"format": "x"}', ("is not a golden file",))],
    ids=["golden-file-empty", "golden-file-not-utf8", "golden-file-a-list", "golden-file-other-format"],
)
def test_unreadable_golden_file(tmp_path: Path, content: bytes, words: tuple[str, ...]) -> None:
    path = tmp_path / "g.json"
    path.write_bytes(content)
    with pytest.raises(golden.GoldenFormatError) as info:
        golden.load_golden(path)
    for word in words:
        assert word in str(info.value)


def test_golden_path_is_a_folder(tmp_path: Path) -> None:
    with pytest.raises(golden.GoldenFormatError, match="is a folder"):
        golden.load_golden(tmp_path)


# -- writing ---------------------------------------------------------------------------------------


def _listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_dump_over_a_folder_is_refused_without_stray_files(pristine: Doc, tmp_path: Path) -> None:
    target = tmp_path / "out"
    target.mkdir()
    with pytest.raises(UsageError, match="is a folder"):
        golden.dump_golden(pristine, target, force=True)
    assert _listing(tmp_path) == ["out"] and _listing(target) == []


def test_dump_refuses_to_overwrite_and_leaves_the_file(pristine: Doc, tmp_path: Path) -> None:
    path = tmp_path / "g.json"
    path.write_text("precious", encoding="utf-8")
    with pytest.raises(OverwriteRefused, match="--force") as info:
        golden.dump_golden(pristine, path)
    assert isinstance(info.value, FileExistsError)
    assert path.read_text(encoding="utf-8") == "precious" and _listing(tmp_path) == ["g.json"]


def test_dump_of_an_invalid_doc_writes_nothing(pristine: Doc, tmp_path: Path) -> None:
    doc = copy.deepcopy(pristine)
    doc["cases"][0]["steps"][0]["token"] = -1
    with pytest.raises(golden.GoldenFormatError, match=r"\$\.cases\[0\]\.steps\[0\]\.token"):
        golden.dump_golden(doc, tmp_path / "g.json")
    assert _listing(tmp_path) == []


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "report.md"
    path.write_text("old", encoding="utf-8")

    def disk_full(*_: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("infer_ref.fileio.os.replace", disk_full)
    with pytest.raises(OSError, match="No space left"):
        atomic_write_text(path, "new")
    assert path.read_text(encoding="utf-8") == "old" and _listing(tmp_path) == ["report.md"]


def test_output_under_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("x", encoding="utf-8")
    with pytest.raises(UsageError, match="a parent is a file"):
        atomic_write_text(tmp_path / "a-file" / "out.json", "{}")


@pytest.mark.parametrize(
    "name", ["../x", "a/b", "/etc/passwd", "", ".", "..", "..\\x", "nul\0byte"],
    ids=[f"golden-name-{n}" for n in ("parent", "subfolder", "absolute", "empty", "dot", "dotdot", "backslash", "nul")],
)
def test_output_names_cannot_leave_their_folder(name: str) -> None:
    with pytest.raises(UsageError) as info:
        check_file_name(name)
    assert repr(name) in str(info.value) and "--name" in str(info.value)


# -- verification ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "row", [[math.nan] * 4, [0.0, math.nan, -1.0, -2.0], [-math.inf] * 4, [0.0, math.inf, 0.0, 0.0]],
    ids=["golden-verify-all-nan-logits", "golden-verify-one-nan-logit", "golden-verify-all-neg-inf-logits", "golden-verify-pos-inf-logit"],
)
def test_non_finite_logits_fail_verification_instead_of_passing(row: list[float]) -> None:
    """NaN compares False with every tolerance: without the check, these logits would pass every step."""
    import torch

    case = {"name": "c", "prompt_ids": [1], "steps": [{"token": 0, "top_ids": [0, 1], "top_logprobs": [-0.1, -2.5]}]}

    def start(max_len: int) -> golden.StepFn:
        return lambda ids: torch.tensor(row, dtype=torch.float64)

    result = golden.verify_case(case, start, golden.TOLERANCES["float32"])
    assert result.failures and "our logits cannot decide a token" in result.failures[0].reasons[0]
    assert result.free_match == 0
