"""The golden-file machinery itself: format and schema, metadata checks, the teacher-forced,
tie-aware verifier and its failure messages, the portable weight generator, the CLI.

Uses a small synthetic Gemma (window 16, prompts crossing it) generated here in float32 on CPU,
so it needs no fixture checkpoint and runs in seconds.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from infer_ref.cli.golden import EXIT_EXISTS, EXIT_FORMAT, EXIT_METADATA, EXIT_MISMATCH, EXIT_OK, main
from infer_ref.conformance.oracles import golden

pytest.importorskip("transformers")

NAME = "gemma3-standin"


@pytest.fixture(scope="module")
def golden_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    doc = golden.write_golden(golden.ModelSource.synthetic(NAME), dtype="float32", device="cpu")
    return golden.dump_golden(doc, tmp_path_factory.mktemp("golden") / f"{NAME}.cpu-float32.json")


@pytest.fixture
def doc(golden_file: Path) -> dict[str, Any]:
    return golden.load_golden(golden_file)


def _write(tmp_path: Path, doc: dict[str, Any], name: str = "g.json", *, seal: bool = False) -> Path:
    """``doc`` as a file; ``seal``: with a fresh content digest, as if a generator had written it so."""
    path = tmp_path / name
    path.write_text(json.dumps(golden.seal(doc) if seal else doc), encoding="utf-8")
    return path


# -- format --------------------------------------------------------------------------------------


def test_file_is_self_describing(doc: dict[str, Any]) -> None:
    assert doc["format"] == golden.FORMAT and doc["format_version"] == golden.FORMAT_VERSION
    model, run = doc["model"], doc["run"]
    assert model["source"] == "synthetic" and model["synthetic"]["generator"] == golden.GENERATOR_NAME
    assert len(model["weights_digest"]) == 64 and len(model["config_fingerprint"]) == 64
    assert run["dtype"] == "float32" and run["device"] == "cpu"
    assert run["torch"] == torch.__version__ and "generate" in run["generator"]
    assert doc["sampling"]["strategy"] == "greedy" and doc["sampling"]["stop_on_eos"] is False
    window = model["hf_config"]["sliding_window"]
    first, second = doc["cases"]
    assert len(first["prompt_ids"]) > window  # crossed in prefill
    assert len(second["prompt_ids"]) < window < len(second["prompt_ids"]) + len(second["steps"])  # and in decode
    for step in first["steps"]:
        assert step["top_ids"][0] == step["token"]  # greedy: the golden token is transformers' argmax
        assert step["top_logprobs"] == sorted(step["top_logprobs"], reverse=True)


def test_written_file_is_diffable_one_step_per_line(golden_file: Path) -> None:
    lines = golden_file.read_text(encoding="utf-8").splitlines()
    step_lines = [line for line in lines if line.lstrip().startswith('{"token"')]
    assert len(step_lines) == 24 + 20


def test_roundtrip(doc: dict[str, Any], tmp_path: Path) -> None:
    path = golden.dump_golden(doc, tmp_path / "copy.json")
    assert golden.load_golden(path) == doc


def test_dump_refuses_to_overwrite(doc: dict[str, Any], golden_file: Path) -> None:
    with pytest.raises(FileExistsError, match="--force"):
        golden.dump_golden(doc, golden_file)
    golden.dump_golden(doc, golden_file, force=True)


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda d: d.pop("cases"), r"\$\.cases: missing"),
        (lambda d: d["model"].pop("weights_digest"), r"\$\.model\.weights_digest: missing"),
        (lambda d: d["cases"][0]["steps"][3].update(token="7"), r"\$\.cases\[0\]\.steps\[3\]\.token: expected int"),
        (lambda d: d["cases"][1]["steps"][0]["top_logprobs"].pop(), r"equally long"),
        (lambda d: d["run"].update(dtype="float8"), r"unknown dtype"),
        (
            lambda d: d.update(format_version=golden.FORMAT_VERSION + 1),
            rf"format_version {golden.FORMAT_VERSION + 1}; this infer_ref reads version {golden.FORMAT_VERSION}",
        ),
        (lambda d: d.update(format="something-else"), r"is not a golden file"),
    ],
)
def test_schema_errors(doc: dict[str, Any], tmp_path: Path, edit: Any, match: str) -> None:
    bad = copy.deepcopy(doc)
    edit(bad)
    path = _write(tmp_path, bad)
    with pytest.raises(golden.GoldenFormatError, match=match) as info:
        golden.load_golden(path)
    assert str(path) in str(info.value)


def test_not_json(tmp_path: Path) -> None:
    path = tmp_path / "g.json"
    path.write_text("{not json", encoding="utf-8")
    with pytest.raises(golden.GoldenFormatError, match="not valid JSON"):
        golden.load_golden(path)


# -- metadata --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [("weights_digest", "0" * 64), ("config_fingerprint", "f" * 64)],
)
def test_metadata_mismatch_is_not_a_numerical_mismatch(
    doc: dict[str, Any], tmp_path: Path, field: str, value: str
) -> None:
    doc["model"][field] = value
    path = _write(tmp_path, doc, seal=True)
    with pytest.raises(golden.GoldenMetadataMismatch) as info:
        golden.verify_file(path, impl="infer_ref")
    err = info.value
    assert not isinstance(err, golden.GoldenMismatch)
    assert list(err.fields) == [field] and err.fields[field][0] == value
    assert "metadata mismatch, not a numerical mismatch" in str(err) and field in str(err)


def test_other_weights_seed_is_caught_by_the_digest(doc: dict[str, Any], tmp_path: Path) -> None:
    doc["model"]["synthetic"]["seed"] = 1  # the file now claims weights it was not written with
    path = _write(tmp_path, doc, seal=True)
    with pytest.raises(golden.GoldenMetadataMismatch, match="weights_digest"):
        golden.verify_file(path)


def test_dtype_and_device_mismatch(doc: dict[str, Any]) -> None:
    source = golden.ModelSource.from_golden(doc)
    with pytest.raises(golden.GoldenMetadataMismatch) as info:
        golden.check_metadata(doc, source, dtype="bfloat16", device="cpu")
    assert set(info.value.fields) == {"dtype"}
    doc["run"]["device"] = "cuda"
    with pytest.raises(golden.GoldenMetadataMismatch) as info:
        golden.check_metadata(doc, source, dtype="float32", device="cpu")
    assert info.value.fields == {"device": ("cuda", "cpu")}


def test_versions_and_device_name_are_notes_not_errors(doc: dict[str, Any]) -> None:
    doc["run"]["transformers"] = "0.0.1"
    doc["run"]["device_name"] = "some other GPU"
    notes = golden.check_metadata(doc, golden.ModelSource.from_golden(doc), dtype="float32", device="cpu")
    assert any("transformers" in n for n in notes) and any("device_name" in n for n in notes)


# -- verification on real implementations -----------------------------------------------------------


@pytest.mark.parametrize("impl", ["infer_ref", "transformers"])
def test_both_implementations_pass(golden_file: Path, impl: str) -> None:
    report = golden.verify_file(golden_file, impl=impl)
    assert report.ok and report.free_match == report.total_steps == 44
    assert report.max_abs_dlogprob < 1e-4


def test_wrong_golden_token_fails_with_a_readable_diff(doc: dict[str, Any], tmp_path: Path) -> None:
    step = doc["cases"][0]["steps"][5]
    best, worst = step["top_ids"][0], step["top_ids"][-1]
    # A consistent file whose golden token is one well below the best: listed first, as greedy lists it.
    step["token"] = worst
    step["top_ids"][0], step["top_ids"][-1] = worst, best
    path = _write(tmp_path, doc, "wrong-token.json", seal=True)
    with pytest.raises(golden.GoldenMismatch) as info:
        golden.verify_file(path)
    text = str(info.value)
    assert "case 'prefill-crosses-window'" in text and "first at step 5 (token position 29)" in text
    assert f"golden token {worst}" in text and f"our best is {best}" in text
    assert "golden top-k:" in text and "our top-k:" in text and "golden margin" in text
    assert "free-running exact match: 5 of 24" in text and "repro: infer-ref golden verify" in text
    report = info.value.report
    assert report.cases[0].failures[0].step == 5 and not report.cases[1].failures


def test_topk_logprob_drift_fails(doc: dict[str, Any], tmp_path: Path) -> None:
    doc["cases"][1]["steps"][7]["top_logprobs"][2] -= 0.01  # 10x the fp32 tolerance
    path = _write(tmp_path, doc, seal=True)
    with pytest.raises(golden.GoldenMismatch, match=r"top-k \|Δlogprob\| 0.01"):
        golden.verify_file(path)


def test_planted_sliding_window_bug_is_caught(golden_file: Path) -> None:
    with golden.planted_bug("sliding-window-decode-mask"), pytest.raises(golden.GoldenMismatch) as info:
        golden.verify_file(golden_file, impl="infer_ref")
    failing = {c.name: [f.step for f in c.failures] for c in info.value.report.cases}
    # Decode steps past the window fail; the prefill step (step 0) and decode steps still inside
    # the window of the second prompt (prompt 10, window 16) do not.
    assert failing["prefill-crosses-window"] and failing["prefill-crosses-window"][0] == 1
    assert failing["decode-crosses-window"] and min(failing["decode-crosses-window"]) >= 16 - 10
    golden.verify_file(golden_file, impl="infer_ref")  # the bug is gone again


# -- the verifier on scripted logits: tie-awareness, teacher forcing, free-running length -------------


def _scripted(rows: Sequence[Sequence[float]], fed: list[list[int]]) -> golden.SessionFactory:
    def start(max_len: int) -> golden.StepFn:
        it = iter(rows)

        def step(ids: Sequence[int]) -> torch.Tensor:
            fed.append(list(ids))
            return torch.tensor(next(it), dtype=torch.float64)

        return step

    return start


def _case(tokens: Sequence[int], rows: Sequence[Sequence[float]], k: int = 3) -> dict[str, Any]:
    steps = []
    for token, row in zip(tokens, rows, strict=True):
        lp = torch.log_softmax(torch.tensor(row, dtype=torch.float64), -1)
        vals, ids = lp.topk(k)
        steps.append({"token": token, "top_ids": ids.tolist(), "top_logprobs": vals.tolist()})
    return {"name": "scripted", "prompt_text": None, "prompt_ids": [9, 9], "steps": steps}


TOL = golden.TOLERANCES["float32"]
ROWS = [[5.0, 1.0, 0.0, -1.0], [0.0, 3.0, 3.0 - 5e-5, -1.0], [1.0, 0.0, 4.0, 0.0], [2.0, 0.0, 0.0, 0.0]]


def test_near_tie_passes_and_ends_the_free_running_match() -> None:
    # Step 1: transformers chose token 2, which is 5e-5 below our best (token 1): within eps.
    fed: list[list[int]] = []
    case = _case([0, 2, 2, 0], ROWS)
    result = golden.verify_case(case, _scripted(ROWS, fed), TOL)
    assert not result.failures
    assert result.free_match == 1  # free running would have taken token 1 at step 1
    assert fed == [[9, 9], [0], [2], [2]]  # teacher-forced: the golden tokens are fed, not ours
    assert result.max_deficit == pytest.approx(5e-5, rel=1e-6)


def test_a_gap_beyond_eps_fails() -> None:
    rows = [list(r) for r in ROWS]
    rows[1][2] = 3.0 - 5e-4
    case = _case([0, 2, 2, 0], rows)
    result = golden.verify_case(case, _scripted(rows, []), TOL)
    assert [f.step for f in result.failures] == [1]
    f = result.failures[0]
    assert f.golden_token == 2 and f.our_token == 1 and f.deficit == pytest.approx(5e-4, rel=1e-6)
    assert "below our best" in f.reasons[0]


def test_an_intruder_in_our_topk_fails() -> None:
    # Golden top-2 are {0, 1}; here token 3 rises above the golden 2nd best by far.
    golden_rows = [[5.0, 2.0, -9.0, -9.0]]
    ours = [[5.0, 2.0, -9.0, 4.0]]
    case = _case([0], golden_rows, k=2)
    result = golden.verify_case(case, _scripted(ours, []), TOL)
    assert result.failures and any("token 3 is in our top-k" in r for r in result.failures[0].reasons)


# -- the weight generator ------------------------------------------------------------------------


def test_synthetic_weights_are_deterministic_seeded_and_pinned() -> None:
    spec = golden.SYNTHETIC_MODELS[NAME]
    a = golden.synthetic_state_dict(spec.hf_config, 0, spec.init)
    b = golden.synthetic_state_dict(spec.hf_config, 0, spec.init)
    c = golden.synthetic_state_dict(spec.hf_config, 1, spec.init)
    assert golden.weights_digest(a) == golden.weights_digest(b) != golden.weights_digest(c)
    # Generating in bf16 is rounding the fp32 values: the same bits either way.
    a16 = golden.synthetic_state_dict(spec.hf_config, 0, spec.init, dtype=torch.bfloat16)
    assert all(torch.equal(a16[k], a[k].to(torch.bfloat16)) for k in a)
    # Pinned: a change of the generator changes every synthetic golden file's digest.
    head = a["model.layers.0.mlp.down_proj.weight"].flatten()[:3].tolist()
    assert head == [-0.01526586152613163, 0.11280852556228638, 0.023860063403844833]


def test_noise_is_close_to_standard_normal() -> None:
    x = torch.empty(200_000)
    golden._noise_into(x, golden._tensor_key(0, "x"), 1.0, 0.0)
    assert abs(float(x.mean())) < 0.01 and abs(float(x.std()) - 1.0) < 0.01
    assert float(x.abs().max()) <= 3.47  # Irwin-Hall(4): bounded at sqrt(12)


# -- CLI -----------------------------------------------------------------------------------------


def test_cli_generate_refuses_to_overwrite(golden_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["generate", "--synthetic", NAME, "--out", str(golden_file), "--quiet"])
    assert code == EXIT_EXISTS and "--force" in capsys.readouterr().err


def test_cli_verify_exit_codes(golden_file: Path, doc: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", str(golden_file), "--quiet", "--impl", "transformers"]) == EXIT_OK
    assert "PASS" in capsys.readouterr().out
    assert main(["verify", str(golden_file), "--quiet", "--plant-bug", "sliding-window-decode-mask"]) == EXIT_MISMATCH
    assert "golden mismatch" in capsys.readouterr().out
    meta = copy.deepcopy(doc)
    meta["model"]["weights_digest"] = "0" * 64
    assert main(["verify", str(_write(tmp_path, meta, "m.json", seal=True)), "--quiet"]) == EXIT_METADATA
    assert "metadata mismatch" in capsys.readouterr().out
    fmt = copy.deepcopy(doc)
    fmt["format_version"] = 99
    assert main(["verify", str(_write(tmp_path, fmt, "f.json")), "--quiet"]) == EXIT_FORMAT
