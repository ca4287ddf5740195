"""Self-checks of the kit's low-precision, sampler and stopping machinery: the mutant copies of the
sampler and of the stopping loop, with no bug planted, give infer_ref's results exactly (so each
mutant differs by its bug alone), and the mutant runner's tier bookkeeping. Like ``test_kit.py``,
these test the kit, whatever ``--ir-impl`` says."""

from __future__ import annotations

from pathlib import Path

import torch

from infer_ref.conformance.adapters.reference import INFER_REF
from infer_ref.conformance.interface.adapter import SamplerSpec
from infer_ref.conformance.mutants import CONTROL
from infer_ref.conformance.mutants.__main__ import Outcome, class_report, failed_test_tiers

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "checkpoints" / "llama-tiny"


def test_control_sampler_equals_infer_ref_bit_for_bit() -> None:
    logits = torch.randn(40, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 2
    for spec in (SamplerSpec(), SamplerSpec(0.7, 5, 0.9, 1.3), SamplerSpec(1.5, None, 0.5, 0.8)):
        assert CONTROL.sample_probs is not None and INFER_REF.sample_probs is not None
        assert CONTROL.sample is not None and INFER_REF.sample is not None
        assert torch.equal(CONTROL.sample_probs(logits, [1, 2, 2], spec), INFER_REF.sample_probs(logits, [1, 2, 2], spec))
        assert CONTROL.sample(logits, [1, 2], spec, 7, 200) == INFER_REF.sample(logits, [1, 2], spec, 7, 200)


def test_control_stopping_loop_equals_infer_ref() -> None:
    """On the llama-tiny fixture (its real tokenizer and three EOS ids), with and without stop strings."""
    assert CONTROL.load_model is not None and INFER_REF.load_model is not None
    assert CONTROL.generate_stopping is not None and INFER_REF.generate_stopping is not None
    ctl = CONTROL.load_model(FIXTURE, torch.float32, "cpu")
    ref = INFER_REF.load_model(FIXTURE, torch.float32, "cpu")
    for stop in ((), (" ", "e"), ("the",)):
        got = CONTROL.generate_stopping(ctl, FIXTURE, [433, 20, 30, 40], 24, stop)
        assert got == INFER_REF.generate_stopping(ref, FIXTURE, [433, 20, 30, 40], 24, stop), stop


def test_kill_report_records_tiers_and_flags_classes_the_default_tier_misses(tmp_path: Path) -> None:
    junit = tmp_path / "r.xml"
    junit.write_text(
        '<testsuites><testsuite><testcase classname="tests.property.test_x" name="test_a[1]">'
        '<properties><property name="ir_tier" value="slow"/></properties><failure/></testcase>'
        '<testcase classname="tests.property.test_x" name="test_b"><failure/></testcase>'
        '<testcase classname="tests.property.test_x" name="test_c"/></testsuite></testsuites>'
    )
    assert failed_test_tiers(junit) == {"test_x.py::test_a[1]": "slow", "test_x.py::test_b": "default"}
    from infer_ref.conformance.mutants import MUTANTS

    slow_only = Outcome(MUTANTS["eos_ignored"], 1, ["test_x.py::test_a[1]"], 1.0, "", {"test_x.py::test_a[1]": "slow"})
    report = class_report([slow_only])
    assert "| EOS ignored or only partly honoured | `eos_ignored` | **0 of 1** | slow 1 |" in report


def test_low_precision_definitions_are_transformers_own() -> None:
    """The stated definitions the low-precision tier judges by equal transformers' modules: its
    RMSNorms bit for bit, its bf16 rotary tables within the tier's bound."""
    from transformers import AutoConfig
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding

    from infer_ref.config import ModelConfig
    from infer_ref.conformance.checkpoints.snapshots import tiny_config
    from infer_ref.conformance.oracles.definitions import (
        default_inv_freq,
        rms_norm_definition,
        rope_tables_definition,
    )

    g = torch.Generator().manual_seed(3)
    x = (torch.randn(2, 5, 64, generator=g) * 9).to(torch.bfloat16)
    w = 1.25 + 2.25 * torch.rand(64, generator=g)
    for module, gemma in ((LlamaRMSNorm(64, eps=1e-6), False), (Gemma3RMSNorm(64, eps=1e-6), True)):
        module.weight.data = w.clone()
        module.to(torch.bfloat16)
        with torch.no_grad():
            assert torch.equal(module(x), rms_norm_definition(x, module.weight.data, 1e-6, gemma)), type(module).__name__

    hf_config = tiny_config("llama")
    fields = {k: v for k, v in hf_config.items() if k not in ("model_type", "architectures")}
    rotary = LlamaRotaryEmbedding(AutoConfig.for_model("llama", **fields))
    positions = torch.tensor([0, 7, 1000, 4095, 8191])
    cos, sin = rotary(x, positions[None, :])  # [1, T, D] in bf16
    config = ModelConfig.from_hf_dict(hf_config)
    exp_cos, exp_sin = rope_tables_definition(default_inv_freq(config.computed_head_dim, config.rope), positions, torch.bfloat16)
    for actual, expected in ((cos[0], exp_cos), (sin[0], exp_sin)):
        bound = torch.finfo(torch.bfloat16).eps * expected.double().abs().clamp_min(2**-14) + positions.double()[:, None] * 2**-22
        assert bool(((actual.double() - expected.double()).abs() <= bound).all())
