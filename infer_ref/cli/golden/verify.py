"""``infer-ref golden verify``: check implementations against golden files, teacher-forced."""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path
from typing import Any

from infer_ref.cli.golden.shared import (
    EXIT_FORMAT,
    EXIT_METADATA,
    EXIT_MISMATCH,
    Progress,
    check_golden_files,
    device_problem,
)
from infer_ref.cli.options import check_device, check_output_paths, check_user_adapter
from infer_ref.errors import EXIT_MISSING, EXIT_OK, EXIT_USAGE, InferRefError, exit_code_for
from infer_ref.fileio import atomic_write_text

ADAPTER = "infer_ref.conformance.interface.adapter.Adapter"


def run_verify(
    path: str, impl: str, device: str | None, checkpoint: str | None, plant: str | None, quiet: bool
) -> tuple[int, str, Any]:
    """Verify one file with one implementation: (exit code, message, report or None)."""
    from infer_ref.conformance.oracles import golden

    try:
        doc = golden.load_golden(path)
    except golden.GoldenFormatError as exc:
        return EXIT_FORMAT, str(exc), None
    except (FileNotFoundError, InferRefError) as exc:
        return exit_code_for(exc) or EXIT_MISSING, f"error: {exc}", None
    problem = device_problem(doc, path, device)
    if problem is not None:
        return EXIT_USAGE, f"error: {problem}", None
    bar = Progress(golden.total_steps(doc), f"verify {Path(path).name} [{impl}]", not quiet)
    ctx = golden.planted_bug(plant) if plant else contextlib.nullcontext()
    try:
        with ctx:
            report = golden.verify_file(path, impl=impl, device=device, checkpoint=checkpoint, progress=bar)
    except golden.GoldenMetadataMismatch as exc:
        bar.close()
        return EXIT_METADATA, str(exc), None
    except golden.GoldenMismatch as exc:
        bar.close()
        return EXIT_MISMATCH, str(exc), exc.report
    except (FileNotFoundError, InferRefError) as exc:  # a missing or bad checkpoint, a bad --device ...
        bar.close()
        return exit_code_for(exc) or EXIT_MISSING, f"error: {exc}", None
    except ValueError as exc:  # an adapter that cannot be imported or lacks what verification needs
        bar.close()
        return EXIT_USAGE, f"error: {exc}", None
    bar.close()
    message = report.summary()
    if report.notes:
        message += "\n  notes (not compared): " + "; ".join(report.notes)
    return EXIT_OK, message, report


def cmd_verify(args: argparse.Namespace) -> int:
    check_output_paths(args.json)
    check_golden_files(args.files)
    check_device(args.device)
    for impl in args.impl or []:
        if ":" in impl:  # a conformance adapter: imported here, named by the option typed
            check_user_adapter(impl, "--impl", f"an {ADAPTER} with load_model, make_model_cache and forward")
    worst = EXIT_OK
    results = []
    for path in args.files:
        for impl in args.impl or ["infer_ref"]:
            code, message, report = run_verify(path, impl, args.device, args.checkpoint, args.plant_bug, args.quiet)
            print(message, flush=True)
            results.append(result_json(path, impl, code, message, report))
            worst = max(worst, code)
    if args.json:
        atomic_write_text(args.json, json.dumps(results, indent=1) + "\n")
    return worst


def result_json(path: str, impl: str, code: int, message: str, report: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"file": path, "impl": impl, "exit_code": code, "message": message}
    if report is not None:
        out["ok"] = report.ok
        out["cases"] = [
            {
                "name": c.name,
                "prompt_len": c.prompt_len,
                "steps": c.steps,
                "free_match": c.free_match,
                "max_abs_dlogprob": c.max_abs_dlogprob,
                "max_deficit": c.max_deficit,
                "min_golden_margin": c.min_golden_margin,
                "failing_steps": len(c.failures),
            }
            for c in report.cases
        ]
    return out
