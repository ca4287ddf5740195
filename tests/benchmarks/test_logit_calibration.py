"""calibrate_logit_scale: the logits scale linearly with the final norm to the target entropy, nothing else moves."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch

from benchmarks.bench_utils import build_infer_ref, calibrate_logit_scale, mean_entropy, synthetic_state
from infer_ref.conformance.checkpoints.snapshots import FAMILIES, tiny_config
from infer_ref.conformance.profiles import one_torch_thread


@pytest.fixture(scope="module", autouse=True)
def _one_thread() -> Iterator[None]:
    yield from one_torch_thread()


def _model(family: str, seed: int = 4) -> torch.nn.Module:
    hf_config = tiny_config(family)
    state = synthetic_state(hf_config, torch.device("cpu"), torch.float64, seed=seed)
    return build_infer_ref(hf_config, state, torch.device("cpu"))


@pytest.mark.parametrize("family", FAMILIES)
def test_calibrated_logits_are_the_old_ones_times_c_at_the_target_entropy(family: str) -> None:
    model = _model(family)
    vocab = model.config.vocab_size
    probe = torch.randint(4, vocab, (1, 12), generator=torch.Generator().manual_seed(0))
    other = torch.randint(4, vocab, (1, 9), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        before_probe, before_other = model(probe), model(other)
    target = 0.5 * math.log(vocab)  # half the uniform distribution's entropy: neither extreme
    c = calibrate_logit_scale(model, target, probe)
    # The definition, recomputed from the logits before: softmax(c * logits) has the target mean entropy.
    assert mean_entropy(c * before_probe[0]) == pytest.approx(target, abs=1e-9)
    with torch.inference_mode():
        after_probe, after_other = model(probe), model(other)
    # Linearity in the final norm's (effective) weight: every logit of every prompt times c. The
    # norms normalise in float32 (Gemma also applies its weight there, as transformers does), so
    # the scaled weight is rounded to float32 once: agreement to float32 precision, 1e-6 relative.
    torch.testing.assert_close(after_probe, before_probe * c, rtol=1e-6, atol=1e-6 * float(before_probe.abs().max()))
    torch.testing.assert_close(after_other, before_other * c, rtol=1e-6, atol=1e-6 * float(before_other.abs().max()))
    assert mean_entropy(after_probe[0]) == pytest.approx(target, abs=1e-4)


def test_mean_entropy_from_its_definition() -> None:
    # Uniform over 4: log 4 nats; one-hot (up to exp(-1000)): 0; the mean of the two rows: log(4) / 2.
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0], [1000.0, 0.0, 0.0, 0.0]])
    assert mean_entropy(logits) == pytest.approx(math.log(4) / 2, abs=1e-12)


@pytest.mark.parametrize("target", [0, -1.0, 1e9])
def test_calibration_refuses_a_target_outside_the_possible_entropies(target: float) -> None:
    model = _model("llama")
    weight = model.norm.weight.clone()
    with pytest.raises(ValueError, match=r"target_entropy must lie in \(0, log\(vocab_size\)"):
        calibrate_logit_scale(model, target, torch.tensor([[5, 6]]))
    assert torch.equal(model.norm.weight, weight)
