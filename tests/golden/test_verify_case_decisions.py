"""Golden verification's per-step decisions at their edges, through a session that returns fixed logits.

The expected log-probabilities come from ``torch.log_softmax`` in float64 (the oracle), computed
here from the same float32 logits the session hands out, so a bound set to the measured distance is
met to the last bit: a distance equal to its tolerance passes, anything past it fails."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import Tensor

from infer_ref.conformance.oracles.golden import Tolerance
from infer_ref.conformance.oracles.golden.errors import GoldenMetadataMismatch
from infer_ref.conformance.oracles.golden.verification import check_metadata, verify, verify_case
from infer_ref.conformance.oracles.golden.writing import device_name, run_versions

LOGITS = torch.tensor([1.0, 0.0, -1.0, -2.0], dtype=torch.float32)  # [V=4]: token 0 first, 3 last
LP = [float(v) for v in torch.log_softmax(LOGITS.double(), dim=-1)]  # the float64 oracle


def _start(n: int) -> Any:
    def step(tokens: list[int]) -> Tensor:
        return LOGITS.clone()

    return step


def _case(*steps: tuple[int, list[int], list[float]], prompt: tuple[int, ...] = (0, 1, 2)) -> dict[str, Any]:
    return {
        "name": "c",
        "prompt_ids": list(prompt),
        "steps": [{"token": t, "top_ids": ids, "top_logprobs": lps} for t, ids, lps in steps],
    }


def test_a_step_exactly_like_the_oracle_has_no_distance_and_reports_its_shape() -> None:
    result = verify_case(_case((0, [0, 1], [LP[0], LP[1]])), _start, Tolerance(1e-12, 1e-12))
    # float64 log-softmax: a float32 one would be off by about 1e-8
    assert (result.max_abs_dlogprob, result.max_deficit, result.failures) == (0.0, 0.0, [])
    assert (result.prompt_len, result.steps, result.free_match) == (3, 1, 1)


def test_a_deficit_equal_to_eps_passes_and_beyond_fails() -> None:
    case = _case((1, [0, 1], [LP[0], LP[1]]))  # the golden token is our second: LP[0] - LP[1] below our best
    eps = LP[0] - LP[1]
    assert verify_case(case, _start, Tolerance(eps, 1e-12)).failures == []
    [failure] = verify_case(case, _start, Tolerance(eps * 0.999, 1e-12)).failures
    assert (failure.step, failure.position, failure.golden_token, failure.our_token) == (0, 3, 1, 0)


def test_a_top_k_difference_equal_to_atol_passes_and_beyond_fails() -> None:
    case = _case((0, [0, 1], [LP[0], LP[1] + 0.5]))
    atol = abs(LP[1] - (LP[1] + 0.5))
    assert verify_case(case, _start, Tolerance(1e-12, atol)).failures == []
    [failure] = verify_case(case, _start, Tolerance(1e-12, atol * 0.999)).failures
    assert (failure.worst_token, failure.worst_delta) == (1, atol)


def test_an_intruder_is_judged_against_the_golden_kth_logprob() -> None:
    # Golden top 3 is tokens 0, 2, 3; our top 3 has token 1 instead of 3. Token 1 is LP[1] - LP[3]
    # (2 nats) above the golden 3rd and LP[1] - LP[2] (1 nat) above its 2nd.
    case = _case((0, [0, 2, 3], [LP[0], LP[2], LP[3]]))
    [failure] = verify_case(case, _start, Tolerance(1e-12, 1.5)).failures
    assert "token 1 is in our top-k" in failure.reasons[0]
    assert verify_case(case, _start, Tolerance(1e-12, LP[1] - LP[3])).failures == []  # exactly at the bound


def test_margins_are_the_golden_top_two_gap_and_infinite_with_one_alternative() -> None:
    result = verify_case(_case((0, [0, 1], [-0.5, -2.0]), (0, [0], [-0.5])), _start, Tolerance(10.0, 10.0))
    assert result.golden_margins == [1.5, math.inf] and result.min_golden_margin == 1.5
    single = verify_case(_case((0, [0], [LP[0]])), _start, Tolerance(10.0, 10.0))
    assert single.golden_margins == [math.inf] and single.min_golden_margin == math.inf


def test_failures_are_kept_up_to_the_cap() -> None:
    wrong = (1, [0, 1], [LP[0], LP[1]])  # every step's golden token is our second
    tol = Tolerance(1e-12, 1e-12)
    assert len(verify_case(_case(wrong, wrong, wrong), _start, tol, max_failures=2).failures) == 2
    assert len(verify_case(_case(*[wrong] * 1001), _start, tol).failures) == 1000  # the default cap


class _Config:
    model_type = "llama"

    def fingerprint(self) -> str:
        return "fp"


class _Source:
    """A model source whose weights digest names the dtype and device it was asked for."""

    config = _Config()

    def digest(self, dtype: torch.dtype, device: str) -> str:
        return f"{dtype}@{device}"


def _doc(**model: str) -> dict[str, Any]:
    run = {"dtype": "float32", "device": "cpu", "device_name": device_name("cpu"), **run_versions()}
    fields = {"config_fingerprint": "fp", "model_type": "llama", "weights_digest": "torch.float32@cpu", **model}
    return {"run": run, "model": fields, "cases": [_case((0, [0, 1], [LP[0], LP[1]]))]}


def test_metadata_digest_is_taken_in_the_run_dtype_on_the_run_device() -> None:
    assert check_metadata(_doc(), _Source(), dtype="float32", device="cpu") == []  # type: ignore[arg-type]


def test_a_model_type_mismatch_names_both_types() -> None:
    with pytest.raises(GoldenMetadataMismatch) as caught:
        check_metadata(_doc(model_type="qwen3"), _Source(), dtype="float32", device="cpu", path="g.json")  # type: ignore[arg-type]
    assert caught.value.fields == {"model_type": ("qwen3", "llama")} and caught.value.path == "g.json"


def test_a_differing_device_name_is_a_note_naming_both() -> None:
    doc = _doc()
    doc["run"]["device_name"] = "another cpu"
    notes = check_metadata(doc, _Source(), dtype="float32", device="cpu")  # type: ignore[arg-type]
    assert notes == [f"device_name: golden file 'another cpu', this run {device_name('cpu')!r}"]


def test_verify_reports_what_it_ran() -> None:
    report = verify(_doc(), _start, impl="mine", device="cpu", path="g.json", tolerance=Tolerance(1e-12, 1e-12))
    assert (report.path, report.impl, report.dtype, report.device) == ("g.json", "mine", "float32", "cpu")
    assert report.ok and report.tolerance == Tolerance(1e-12, 1e-12) and len(report.cases) == 1


def test_a_step_whose_top_k_lists_differ_in_length_is_refused_not_truncated() -> None:
    # Judging only the pairs both lists have would drop golden tokens from the check unnoticed.
    case = _case((0, [0, 1, 2], [LP[0], LP[1]]))
    with pytest.raises(ValueError, match="shorter"):
        verify_case(case, _start, Tolerance(10.0, 10.0))


def test_without_a_path_the_file_is_named_golden_in_placeholder_brackets() -> None:
    with pytest.raises(GoldenMetadataMismatch) as caught:
        check_metadata(_doc(model_type="qwen3"), _Source(), dtype="float32", device="cpu")  # type: ignore[arg-type]
    assert caught.value.path == "<golden>"
    assert verify(_doc(), _start, impl="mine", device="cpu").path == "<golden>"


@pytest.mark.parametrize(("tokens", "failing_step", "free_match"), [((1, 0, 0), 0, 0), ((0, 0, 1), 2, 2)])
def test_a_wrong_token_at_the_first_or_last_step_is_named_there(
    tokens: tuple[int, ...], failing_step: int, free_match: int
) -> None:
    # Our argmax is always token 0; a golden token 1 is LP[0] - LP[1] below it, beyond eps = 1e-12.
    result = verify_case(_case(*[(t, [0, 1], [LP[0], LP[1]]) for t in tokens]), _start, Tolerance(1e-12, 1e-12))
    [failure] = result.failures
    assert (failure.step, failure.position, failure.golden_token, failure.our_token) == (failing_step, 3 + failing_step, 1, 0)
    assert failure.deficit == LP[0] - LP[1] and result.free_match == free_match
