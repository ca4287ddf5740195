"""Teacher-forced verification of an implementation against a golden file (metadata checked first)."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from infer_ref.conformance.oracles.golden.errors import GoldenMetadataMismatch
from infer_ref.conformance.oracles.golden.format import DTYPES, load_golden
from infer_ref.conformance.oracles.golden.implementations import sessions_for
from infer_ref.conformance.oracles.golden.results import CaseResult, StepFailure, VerifyReport
from infer_ref.conformance.oracles.golden.sessions import SessionFactory
from infer_ref.conformance.oracles.golden.sources import ModelSource, repo_relative
from infer_ref.conformance.oracles.golden.tolerances import Tolerance, tolerance_for
from infer_ref.conformance.oracles.golden.writing import device_name, run_versions, top_logprobs
from infer_ref.validation import nonfinite_summary


def check_metadata(
    doc: Mapping[str, Any], source: ModelSource, *, dtype: str, device: str, path: str = "<golden>"
) -> list[str]:
    """Raise :class:`GoldenMetadataMismatch` if the golden file does not describe this run.

    Compared: config fingerprint, weights digest, dtype, device type. Returns notes about fields
    that differ without invalidating the comparison (device name, torch/transformers versions).
    """
    torch_dtype = DTYPES[dtype]
    model = doc["model"]
    fields: dict[str, tuple[Any, Any]] = {}
    if doc["run"]["dtype"] != dtype:
        fields["dtype"] = (doc["run"]["dtype"], dtype)
    run_device = torch.device(device).type
    if doc["run"]["device"] != run_device:
        fields["device"] = (doc["run"]["device"], run_device)
    fingerprint = source.config.fingerprint()
    if model["config_fingerprint"] != fingerprint:
        fields["config_fingerprint"] = (model["config_fingerprint"], fingerprint)
    if model["model_type"] != source.config.model_type:
        fields["model_type"] = (model["model_type"], source.config.model_type)
    if "dtype" not in fields:  # synthetic weights are generated in the run dtype: digest only comparable then
        digest = source.digest(torch_dtype, device)
        if model["weights_digest"] != digest:
            fields["weights_digest"] = (model["weights_digest"], digest)
    if fields:
        raise GoldenMetadataMismatch(path, fields)
    notes = []
    here = {"device_name": device_name(device), **run_versions()}
    for key, value in here.items():
        if doc["run"].get(key) != value:
            notes.append(f"{key}: golden file {doc['run'].get(key)!r}, this run {value!r}")
    return notes


def verify_case(
    case: Mapping[str, Any],
    start: SessionFactory,
    tol: Tolerance,
    *,
    max_failures: int = 1000,
) -> CaseResult:
    """Teacher-force one case's golden tokens through a fresh session; compare every step."""
    prompt = [int(t) for t in case["prompt_ids"]]
    steps = case["steps"]
    step_fn = start(len(prompt) + len(steps))
    logits = step_fn(prompt)
    free_match = 0
    diverged = False
    max_abs = 0.0
    max_deficit = 0.0
    margins: list[float] = []
    failures: list[StepFailure] = []
    for i, golden in enumerate(steps):
        # NaN logits would compare False against every tolerance and pass: they fail explicitly.
        not_finite = nonfinite_summary(logits.detach())
        lp = torch.log_softmax(logits.detach().to(torch.float64), dim=-1).cpu()
        g_token = int(golden["token"])
        g_ids = [int(t) for t in golden["top_ids"]]
        g_lps = [float(v) for v in golden["top_logprobs"]]
        k = len(g_ids)
        our_top = list(zip(*top_logprobs(lp, k, ndigits=None), strict=True))
        best_token, best_lp = our_top[0]
        golden_lp_here = float(lp[g_token])
        deficit = best_lp - golden_lp_here
        deltas = [abs(float(lp[t]) - v) for t, v in zip(g_ids, g_lps, strict=True)]
        worst = max(range(k), key=lambda j: deltas[j])
        # Tokens of our top-k outside the golden top-k must not beat the golden k-th by more than atol.
        kth = g_lps[-1]
        intruders = [(t, v) for t, v in our_top if t not in set(g_ids) and v > kth + tol.topk_atol]
        margin = g_lps[0] - g_lps[1] if k > 1 else math.inf
        margins.append(margin)
        max_abs = max(max_abs, deltas[worst])
        max_deficit = max(max_deficit, deficit)
        if not diverged and best_token == g_token and not_finite is None:
            free_match += 1
        else:
            diverged = True
        reasons = [] if not_finite is None else [f"our logits cannot decide a token: {not_finite}"]
        if deficit > tol.eps:
            reasons.append(f"golden token is {deficit:.4g} below our best (> eps {tol.eps})")
        if deltas[worst] > tol.topk_atol:
            reasons.append(f"top-k |Δlogprob| {deltas[worst]:.4g} > {tol.topk_atol}")
        if intruders:
            t, v = intruders[0]
            reasons.append(
                f"token {t} is in our top-k at {v:.4f} but below the golden top-k (golden k-th {kth:.4f})"
            )
        if reasons and len(failures) < max_failures:
            failures.append(
                StepFailure(
                    step=i,
                    position=len(prompt) + i,
                    golden_token=g_token,
                    our_token=best_token,
                    golden_token_lp=golden_lp_here,
                    best_lp=best_lp,
                    deficit=deficit,
                    worst_token=g_ids[worst],
                    worst_delta=deltas[worst],
                    golden_top=list(zip(g_ids, g_lps, strict=True)),
                    our_top=our_top,
                    golden_margin=margin,
                    reasons=reasons,
                )
            )
        if i + 1 < len(steps):
            logits = step_fn([g_token])  # teacher forcing: always the golden token
    finite = [m for m in margins if math.isfinite(m)]
    return CaseResult(
        name=str(case["name"]),
        prompt_len=len(prompt),
        steps=len(steps),
        free_match=free_match,
        max_abs_dlogprob=max_abs,
        max_deficit=max_deficit,
        min_golden_margin=min(finite) if finite else math.inf,
        golden_margins=margins,
        failures=failures,
    )


def verify(
    doc: Mapping[str, Any],
    start: SessionFactory,
    *,
    impl: str,
    device: str,
    path: str = "<golden>",
    tolerance: Tolerance | None = None,
    progress: Callable[[int], None] | None = None,
) -> VerifyReport:
    """Verify every case of ``doc`` through ``start`` (metadata must already be checked)."""
    dtype = doc["run"]["dtype"]
    tol = tolerance or tolerance_for(dtype)
    cases = []
    for case in doc["cases"]:
        cases.append(verify_case(case, start, tol))
        if progress:
            progress(len(case["steps"]))
    return VerifyReport(path=path, impl=impl, dtype=dtype, device=torch.device(device).type, tolerance=tol, cases=cases)


def verify_file(
    path: str | os.PathLike[str],
    *,
    impl: str = "infer_ref",
    device: str | None = None,
    checkpoint: str | os.PathLike[str] | None = None,
    sessions: SessionFactory | None = None,
    source: ModelSource | None = None,
    raise_on_failure: bool = True,
    progress: Callable[[int], None] | None = None,
) -> VerifyReport:
    """Load, check metadata, verify teacher-forced; raise :class:`GoldenMismatch` on failure.

    ``sessions`` verifies any implementation (default: load ``impl`` from the file's model).
    """
    doc = load_golden(path)
    shown = repo_relative(Path(path))
    device = device or doc["run"]["device"]
    dtype = doc["run"]["dtype"]
    source = source or ModelSource.from_golden(doc, checkpoint)
    notes = check_metadata(doc, source, dtype=dtype, device=device, path=shown)
    start = sessions or sessions_for(impl, source, dtype, device)
    report = verify(doc, start, impl=impl, device=device, path=shown, progress=progress)
    report.notes = notes
    if raise_on_failure:
        tk = source.tokenizer()
        report.raise_for_failures((lambda t: tk.decode([t], skip_special_tokens=False)) if tk else None)
    return report


def total_steps(doc: Mapping[str, Any]) -> int:
    return sum(len(c["steps"]) for c in doc["cases"])
