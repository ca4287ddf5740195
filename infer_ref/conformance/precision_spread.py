"""How far correct float64 computations spread: the measurement behind the float64 tolerances.

A float64 implementation may legitimately hold one step in float32: the norm (transformers), the
norm's weight multiply as well (litgpt: ``(x_normed * weight.float()).to(dtype)``), the RoPE
frequencies and angles (transformers), the softmax (transformers' eager attention). Each variant
below is transformers in float64 with exactly those steps in float32 and the rest lifted to float64
(:mod:`~infer_ref.conformance.oracles.float64_definition`); its distance from the definition (every
step in float64) is the spread a correct implementation can show. The planted bugs of the model
tier are measured the same way, so the tolerances can be checked to sit between the two
(``tests/kit/test_float64_tolerances.py``; the table is in docs/conformance.md).

The distance is :func:`~infer_ref.conformance.tiers.needed_tolerance`, the one ``assert_close``
tests: the smallest ``t`` with ``|actual - expected| <= t + t * |expected|`` at every logit.

    python -m infer_ref.conformance.precision_spread [--examples N] [--mutants] [--json FILE]

``--json FILE`` also writes the table as a record (``{"command", "examples", "rows": {row: {family:
distance}}}``, a raised bug as ``Infinity``); docs/conformance.md's tables are generated from the
committed one, ``benchmarks/log/precision_spread.json`` (``scripts/doc_figures.py``).
"""

from __future__ import annotations

import argparse
import json
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from infer_ref.conformance import case_models
from infer_ref.conformance.checkpoints.snapshots import FAMILIES
from infer_ref.conformance.interface.adapter import Adapter
from infer_ref.conformance.oracles.float64_definition import lift_float32_casts
from infer_ref.conformance.strategies import ModelCase
from infer_ref.conformance.tiers import needed_tolerance

# name -> (attention implementation, norms lifted, RoPE lifted, norm forward replaced by litgpt's)
VARIANTS: dict[str, tuple[str, bool, bool, bool]] = {
    "definition (every step float64)": ("sdpa", True, True, False),
    "norm in float32 (transformers)": ("sdpa", False, True, False),
    "norm and weight multiply in float32 (litgpt)": ("sdpa", True, True, True),
    "RoPE frequencies and angles in float32": ("sdpa", True, False, False),
    "softmax in float32 (eager attention)": ("eager", True, True, False),
    "all of transformers' float32 steps (eager, as shipped)": ("eager", False, False, False),
    "litgpt's norm and transformers' RoPE": ("sdpa", True, False, True),
}
DEFINITION = next(iter(VARIANTS))


def _litgpt_norm(self: Any, x: Tensor) -> Tensor:
    """litgpt's RMSNorm: normalise in float32, multiply by the weight in float32, round once."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + getattr(self, "variance_epsilon", getattr(self, "eps", 1e-6)))
    weight = (1.0 + self.weight.float()) if type(self).__name__.startswith("Gemma") else self.weight.float()
    return (normed * weight).to(x.dtype)


def variant_model(case: ModelCase, name: str) -> nn.Module:
    """transformers in float64 on ``case``'s weights, computed as variant ``name``."""
    from transformers import AutoConfig, AutoModelForCausalLM

    attention, norms, rope, litgpt = VARIANTS[name]
    _, state = case_models.snapshot(case)
    fields = {k: v for k, v in case.hf_config.items() if k not in ("model_type", "architectures")}
    config = AutoConfig.for_model(case.hf_config["model_type"], **fields)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float64, attn_implementation=attention)
    model.load_state_dict({k: v.double() for k, v in state.items()}, strict=False)
    lift_float32_casts(model.eval(), case.hf_config, norms=norms, rope=rope)
    if litgpt:
        for module in model.modules():
            if type(module).__name__.endswith("RMSNorm"):
                module.forward = types.MethodType(_litgpt_norm, module)
    return model


def drawn_cases(family: str, examples: int) -> Iterator[tuple[ModelCase, Tensor]]:
    """``examples`` (case, ids ``[B, T]``) pairs as the model tier draws them (derandomized)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from infer_ref.conformance import strategies as irst

    drawn: list[tuple[ModelCase, Tensor]] = []

    @settings(max_examples=examples, derandomize=True, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def draw(data: st.DataObject) -> None:
        case = data.draw(irst.model_configs(family))
        total = data.draw(irst.sequence_lengths(case))
        drawn.append((case, data.draw(irst.token_ids(case.hf_config["vocab_size"], 2, total))))

    draw()
    return iter(drawn[:examples])


LogitsOf = Callable[[ModelCase, Tensor], Tensor]


def cached_run_logits(adapter: Adapter) -> LogitsOf:
    """An adapter's float64 logits ``[B, T, V]`` through its cache: the first half of ``ids`` as one
    chunk, the rest one token at a time (Gemma: across several windows). A refusal or a crash reads
    as an infinite distance (the bug was caught, by the implementation itself)."""

    def logits_of(case: ModelCase, ids: Tensor) -> Tensor:
        assert adapter.forward is not None and adapter.make_model_cache is not None
        model = case_models.load(adapter, case)
        prompt = max(1, ids.shape[1] // 2)
        try:
            cache = adapter.make_model_cache(model, 2 * ids.shape[1] + 2, ids.shape[0])  # room for a doubled advance
            chunks = [adapter.forward(model, ids[:, :prompt], cache)]
            chunks += [adapter.forward(model, ids[:, p : p + 1], cache) for p in range(prompt, ids.shape[1])]
            return torch.cat(chunks, dim=1)  # [B, T, V]
        except Exception:
            return torch.full((1,), float("inf"))

    return logits_of


def mutant_rows() -> dict[str, LogitsOf]:
    """The control copy and every planted bug of the model tier, as :func:`cached_run_logits` rows."""
    from infer_ref.conformance.mutants import CONTROL, MUTANTS

    rows = {"infer_ref (control copy)": cached_run_logits(CONTROL)}
    rows.update({name: cached_run_logits(m.adapter) for name, m in MUTANTS.items() if "test_model.py" in m.targets})
    return rows


def _variant_logits(name: str) -> LogitsOf:
    return lambda case, ids: variant_model(case, name)(ids).logits


@torch.inference_mode()
def measure(examples: int = 8, extra: dict[str, LogitsOf] | None = None) -> dict[str, dict[str, float]]:
    """``{variant or extra name: {family: worst needed tolerance against the definition}}`` over
    ``examples`` drawn cases per family. ``extra`` maps a name to ``logits(case, ids)`` (a mutant)."""
    rows: dict[str, LogitsOf] = {name: _variant_logits(name) for name in VARIANTS}
    rows.update(extra or {})
    out: dict[str, dict[str, float]] = {name: {} for name in rows}
    for family in FAMILIES:
        for case, ids in drawn_cases(family, examples):
            definition = variant_model(case, DEFINITION)(ids).logits  # [B, T, V]
            for name, logits_of in rows.items():
                distance = needed_tolerance(logits_of(case, ids), definition)
                out[name][family] = max(out[name].get(family, 0.0), distance)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=8, help="drawn cases per family (default 8)")
    parser.add_argument("--mutants", action="store_true", help="also the control copy and the model tier's planted bugs")
    parser.add_argument("--json", type=Path, metavar="FILE", help="also write the table as a JSON record to FILE")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    table = measure(args.examples, mutant_rows() if args.mutants else None)
    if args.json is not None:
        command = f"python -m infer_ref.conformance.precision_spread --examples {args.examples}" + " --mutants" * args.mutants
        record = {"command": command, "examples": args.examples, "rows": table}
        args.json.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print("| computation | " + " | ".join(FAMILIES) + " |")
    print("|---|" + "---|" * len(FAMILIES))
    for name, row in table.items():
        print(f"| {name} | " + " | ".join(f"{row.get(f, 0.0):.1e}" for f in FAMILIES) + " |")


if __name__ == "__main__":
    main()
