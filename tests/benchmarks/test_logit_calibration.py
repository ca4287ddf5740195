"""calibrate_logit_scale: the logits scale linearly with the final norm, nothing else moves."""

from __future__ import annotations

import pytest
import torch

from benchmarks.bench_utils import build_infer_ref, calibrate_logit_scale, synthetic_state
from infer_ref.testing.synthetic import FAMILIES, tiny_config

torch.set_num_threads(1)


@pytest.mark.parametrize("family", FAMILIES)
def test_calibrated_logits_are_the_old_ones_times_c_with_the_target_std(family: str) -> None:
    hf_config = tiny_config(family)
    model = build_infer_ref(hf_config, synthetic_state(hf_config, torch.device("cpu"), torch.float64, seed=4), torch.device("cpu"))
    probe = torch.randint(4, hf_config["vocab_size"], (1, 12), generator=torch.Generator().manual_seed(0))
    other = torch.randint(4, hf_config["vocab_size"], (1, 9), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        before_probe, before_other = model(probe), model(other)
    target = 7.5 * float(before_probe[0, -1].std())  # far from the current spread: c must be 7.5
    c = calibrate_logit_scale(model, target, probe)
    assert c == pytest.approx(7.5, rel=1e-12)
    with torch.inference_mode():
        after_probe, after_other = model(probe), model(other)
    # Linearity in the final norm's (effective) weight: every logit of every prompt times c. The
    # norms normalise in float32 (Gemma also applies its weight there, as transformers does), so
    # the scaled weight is rounded to float32 once: agreement to float32 precision, 1e-6 relative.
    torch.testing.assert_close(after_probe, before_probe * c, rtol=1e-6, atol=1e-6 * float(before_probe.abs().max()))
    torch.testing.assert_close(after_other, before_other * c, rtol=1e-6, atol=1e-6 * float(before_other.abs().max()))
    assert float(after_probe[0, -1].std()) == pytest.approx(target, rel=1e-6)


def test_calibration_refuses_a_non_positive_target() -> None:
    hf_config = tiny_config("llama")
    model = build_infer_ref(hf_config, synthetic_state(hf_config, torch.device("cpu"), torch.float64), torch.device("cpu"))
    weight = model.norm.weight.clone()
    with pytest.raises(ValueError, match="target_std must be positive, got 0"):
        calibrate_logit_scale(model, 0, torch.tensor([[5, 6]]))
    assert torch.equal(model.norm.weight, weight)
