"""The self-consistency verdict of one engine run: each request's answer under some schedule against
the same request run alone, cold, on the plain engine (the reference of every self-consistency
property); a failure raises with the requests that differ and a repro. Shared by the default and the
long-context workloads.
"""

from __future__ import annotations

from pathlib import Path

from infer_ref.conformance.engines.protocol import EngineOutput, EngineRequest
from infer_ref.conformance.engines.session import EngineTier
from infer_ref.conformance.engines.verdicts.compare import compare_outputs, largest_difference
from infer_ref.conformance.engines.verdicts.repro import write_repro


def judge_against_alone(model_dir: Path, tier: EngineTier, requests: list[EngineRequest], outputs: list[EngineOutput], what: str,
                        test: str, schedule: list[list[int]], kind: str = "stressed") -> None:  # fmt: skip
    """``outputs`` (the requests as ``schedule`` sent them to the ``kind`` engine) against each
    request alone on the plain engine, within the engine's self-consistency tolerance."""
    tol = tier.consistency.value
    report = []
    for i, (request, output) in enumerate(zip(requests, outputs, strict=True)):
        reference = tier.alone(model_dir, request)
        tier.spreads.record(f"{test}[{model_dir.name}]", largest_difference(reference, output))
        problems = compare_outputs(reference, output, tol)
        if problems:
            report.append(f"request {i} ({len(request.prompt)} prompt tokens): " + "; ".join(problems[:3]))
    if report:
        summary = f"{what}: {len(report)} of {len(requests)} requests differ from the same request alone"
        alone = [[i] for i in range(len(requests))]
        repro = write_repro(tier.handle(model_dir, kind), test, model_dir, requests, [alone, schedule], f"{summary}: {report[0]}", tol,
                            tier.selects(), tier.start_of(kind))  # fmt: skip
        raise AssertionError(summary + ":\n" + "\n".join(report) + "\n" + repro)


__all__ = ["judge_against_alone"]
