"""``infer-ref golden report``: verify files with several implementations, write a markdown report."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from infer_ref.cli.golden import shared
from infer_ref.cli.golden.report_markdown import markdown
from infer_ref.cli.golden.verify import result_json, run_verify
from infer_ref.cli.options import check_device, check_output_paths
from infer_ref.errors import EXIT_OK, EXIT_USAGE, DataError
from infer_ref.fileio import atomic_write_text


def cmd_report(args: argparse.Namespace) -> int:
    """Verify each file with each implementation and write a markdown report."""
    check_output_paths(args.out, args.json)
    shared.check_golden_files(args.files)
    check_device(args.device)
    reuse, reused_planted = _read_reuse(args.reuse)
    rows: list[dict[str, Any]] = []
    files_meta: list[dict[str, Any]] = []
    worst = EXIT_OK
    t_all = time.perf_counter()
    for path in args.files:
        worst = max(worst, _report_file(path, args, reuse, rows, files_meta))
    planted, code = _planted_bug_check(args, reused_planted)
    worst = max(worst, code)

    text = markdown(rows, files_meta, planted, args.device, time.perf_counter() - t_all, args)
    out = atomic_write_text(args.out, text)
    print(f"wrote {out}")
    if args.json:
        data = [
            result_json(r["file"], r["impl"], r["code"], r["message"], r.get("report")) for r in rows
        ] + ([{"planted_bug": planted}] if planted else [])
        atomic_write_text(args.json, json.dumps(data, indent=1, default=str) + "\n")
    return worst


def _read_reuse(path: str | None) -> tuple[dict[tuple[str, str], dict[str, Any]], dict[str, Any] | None]:
    """``--reuse``: results already computed, by (file name, impl), and the planted-bug entry if any."""
    reuse: dict[tuple[str, str], dict[str, Any]] = {}
    reused_planted: dict[str, Any] | None = None
    if path and Path(path).is_file():
        for entry in json_lines(Path(path)):
            if "planted_bug" in entry:
                reused_planted = entry
            else:
                reuse[(Path(entry["file"]).name, entry["impl"])] = entry
    return reuse, reused_planted


def _report_file(
    path: str,
    args: argparse.Namespace,
    reuse: dict[tuple[str, str], dict[str, Any]],
    rows: list[dict[str, Any]],
    files_meta: list[dict[str, Any]],
) -> int:
    """Verify one golden file with every ``--impl``, adding its rows and metadata; the worst exit code."""
    from infer_ref.conformance.oracles import golden

    try:
        doc = golden.load_golden(path)
    except golden.GoldenFormatError as exc:
        rows.append({"file": path, "impl": "-", "code": shared.EXIT_FORMAT, "message": str(exc)})
        return shared.EXIT_FORMAT
    problem = shared.device_problem(doc, path, args.device)
    if problem is not None:
        print(f"error: {problem}", flush=True)  # as verify prints each file's verdict
        rows.append({"file": path, "impl": "all", "code": EXIT_USAGE, "message": f"error: {problem}"})
        return EXIT_USAGE
    dev = args.device or doc["run"]["device"]
    source = golden.ModelSource.from_golden(doc)
    files_meta.append(_file_meta(path, doc))
    try:
        golden.check_metadata(doc, source, dtype=doc["run"]["dtype"], device=dev, path=path)
    except golden.GoldenMetadataMismatch as exc:
        rows.append({"file": path, "impl": "all", "code": shared.EXIT_METADATA, "message": str(exc)})
        return shared.EXIT_METADATA
    worst = EXIT_OK
    hf_model = None
    for impl in args.impl or golden.IMPLEMENTATIONS:
        reused = reuse.get((Path(path).name, impl))
        if reused is not None:
            report = golden.VerifyReport.from_dict(reused["report"])
            code = EXIT_OK if report.ok else shared.EXIT_MISMATCH
            worst = max(worst, code)
            message = report.summary() if report.ok else golden.format_failure(report)
            rows.append({"file": path, "impl": impl, "code": code, "report": report, "seconds": reused.get("seconds", 0.0), "message": message})
            continue
        t0 = time.perf_counter()
        dtype = golden.DTYPES[doc["run"]["dtype"]]
        if impl == "infer_ref":
            sessions = golden.infer_ref_sessions(golden.load_infer_ref_model(source, dtype, dev), device=dev)
        else:
            hf_model = hf_model or golden.load_transformers_model(source, dtype, dev)
            sessions = (
                golden.transformers_sessions(hf_model)
                if impl == "transformers"
                else golden.transformers_uncached_sessions(hf_model)
            )
        bar = shared.Progress(golden.total_steps(doc), f"report {Path(path).name} [{impl}]", not args.quiet)
        report = golden.verify(doc, sessions, impl=impl, device=dev, path=path, progress=bar)
        bar.close()
        code = EXIT_OK if report.ok else shared.EXIT_MISMATCH
        if impl != "transformers-uncached":  # the uncached run measures noise; it is not a gate
            worst = max(worst, code)
        message = report.summary() if report.ok else golden.format_failure(report)
        print(message, flush=True)
        rows.append({"file": path, "impl": impl, "code": code, "report": report, "seconds": time.perf_counter() - t0, "message": message})
    del hf_model
    source._state = None
    shared.free_cuda()
    return worst


def _file_meta(path: str, doc: dict[str, Any]) -> dict[str, Any]:
    """What the report says about a golden file: its model, cases, margins and where it was made."""
    from infer_ref.conformance.oracles import golden

    return {
        "file": path,
        "model": doc["model"]["name"],
        "source": doc["model"]["source"],
        "cases": ", ".join(f"{c['name']} ({len(c['prompt_ids'])}+{len(c['steps'])})" for c in doc["cases"]),
        "margins": golden.margin_percentiles(shared.golden_margins(doc)),
        "generated_on": f"{doc['run']['device_name']}, torch {doc['run']['torch']}, transformers {doc['run']['transformers']}",
    }


def _planted_bug_check(args: argparse.Namespace, reused_planted: dict[str, Any] | None) -> tuple[dict[str, Any] | None, int]:
    """``--plant-bug``: the bug's verification (reused when ``--reuse`` holds it) and the exit code it
    forces: it must be caught as a real mismatch."""
    if not args.plant_bug:
        return None, EXIT_OK
    if reused_planted is not None and reused_planted["planted_bug"] == args.plant_bug:
        planted = {"bug": args.plant_bug, "file": reused_planted["file"], "code": reused_planted["code"], "message": reused_planted["message"]}
    else:
        target = args.plant_bug_file or args.files[-1]
        code, message, _ = run_verify(target, "infer_ref", args.device, None, args.plant_bug, args.quiet)
        planted = {"bug": args.plant_bug, "file": target, "code": code, "message": message}
        print(f"planted bug {args.plant_bug!r} on {target}: exit {code}", flush=True)
    return planted, EXIT_OK if planted["code"] == shared.EXIT_MISMATCH else shared.EXIT_MISMATCH


def json_lines(path: Path) -> list[dict[str, Any]]:
    """The objects of a JSON-lines file, or :class:`DataError` naming the file and line."""
    entries = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(f"{path}:{number} is not a JSON object: {err}") from None
        if not isinstance(entry, dict) or not ("planted_bug" in entry or {"file", "impl", "report"} <= set(entry)):
            raise DataError(f"{path}:{number}: expected a result object with file, impl and report (or planted_bug)")
        entries.append(entry)
    return entries
