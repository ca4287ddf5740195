"""``infer-ref golden generate|verify|report``: write golden files from transformers, check them.

Also runs standalone: ``python -m infer_ref.golden_cli generate|verify|report ...``.

Exit codes (``docs/errors.md``): 0 pass · 1 golden mismatch (a real numerical disagreement) · 2 usage
error · 3 not a readable golden file (schema, counts, ids, non-finite values, content digest) or a
bad checkpoint · 4 refused to overwrite an existing file (pass ``--force``) · 5 a file or checkpoint
folder is missing · 6 metadata mismatch (the file describes other weights, config, dtype or device).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from infer_ref.errors import (
    EXIT_BAD_DATA,
    EXIT_FAILED_CHECK,
    EXIT_METADATA,
    EXIT_MISSING,
    EXIT_OK,
    EXIT_REFUSED_OVERWRITE,
    EXIT_USAGE,
    DataError,
    InferRefError,
    OverwriteRefused,
    UsageError,
    exit_code_for,
    run_reporting_user_errors,
)
from infer_ref.fileio import atomic_write_text, check_file_name, check_output_path

EXIT_MISMATCH = EXIT_FAILED_CHECK
EXIT_FORMAT = EXIT_BAD_DATA
EXIT_EXISTS = EXIT_REFUSED_OVERWRITE

__all__ = [
    "EXIT_EXISTS", "EXIT_FORMAT", "EXIT_METADATA", "EXIT_MISMATCH", "EXIT_MISSING", "EXIT_OK", "EXIT_USAGE",
    "add_golden_commands", "main", "run",
]


# -- progress --------------------------------------------------------------------------------------


class Progress:
    """A tqdm bar on a terminal (when tqdm is importable), else a line every 25%."""

    def __init__(self, total: int, desc: str, enabled: bool = True) -> None:
        self.total, self.desc, self.enabled, self.done, self._last = total, desc, enabled, 0, -1
        self._bar: Any = None
        self._t0 = time.perf_counter()
        if enabled and sys.stderr.isatty():
            try:
                from tqdm import tqdm

                self._bar = tqdm(total=total, desc=desc, unit="tok", file=sys.stderr, dynamic_ncols=True)
            except ImportError:
                self._bar = None

    def __call__(self, n: int) -> None:
        self.done += n
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(n)
            return
        quarter = int(4 * self.done / max(self.total, 1))
        if quarter != self._last:
            self._last = quarter
            rate = self.done / max(time.perf_counter() - self._t0, 1e-9)
            print(f"{self.desc}: {self.done}/{self.total} tokens ({rate:.0f} tok/s)", file=sys.stderr, flush=True)

    def close(self) -> float:
        if self._bar is not None:
            self._bar.close()
        return time.perf_counter() - self._t0


# -- commands --------------------------------------------------------------------------------------


def _cmd_generate(args: argparse.Namespace) -> int:
    from infer_ref import golden

    _check_generate_args(args)
    sources = [golden.ModelSource.checkpoint(p) for p in args.checkpoint or []]
    sources += [golden.ModelSource.synthetic(n) for n in args.synthetic or []]
    if args.name:
        sources[0].name = args.name
    outs = [
        Path(args.out) if args.out else golden.default_golden_path(src.name, args.dtype, args.device, Path(args.out_dir))
        for src in sources
    ]
    # Every output is checked before anything is generated (minutes of work for a real model).
    folders = [str(o) for o in outs if o.is_dir()]
    if folders:
        raise UsageError(f"output path(s) {', '.join(folders)} are folders: expected golden file paths")
    existing = [str(o) for o in outs if o.exists()]
    if existing and not args.force:
        raise OverwriteRefused(f"{', '.join(existing)} exist(s); pass --force to overwrite golden files")
    for source, out in zip(sources, outs, strict=True):
        prompts = source.prompts()
        total = sum(args.max_new_tokens or p.get("max_new_tokens") or 64 for p in prompts)
        bar = Progress(total, f"generate {out.name}", not args.quiet)
        doc = golden.write_golden(
            source,
            dtype=args.dtype,
            device=args.device,
            top_k=args.top_k,
            max_new_tokens=args.max_new_tokens,
            progress=bar,
            log=None if args.quiet else (lambda m: print(f"  {m}", file=sys.stderr, flush=True)),
        )
        seconds = bar.close()
        golden.dump_golden(doc, out, force=args.force)
        steps = golden.total_steps(doc)
        margins = [
            s["top_logprobs"][0] - s["top_logprobs"][1] for c in doc["cases"] for s in c["steps"] if len(s["top_logprobs"]) > 1
        ]
        pct = golden.margin_percentiles(margins)
        print(
            f"wrote {out}: {len(doc['cases'])} prompt(s), {steps} steps in {seconds:.1f}s; golden margin "
            f"min {pct[0]:.3g} p1 {pct[1]:.3g} p5 {pct[2]:.3g} median {pct[4]:.3g}",
            flush=True,
        )
        source._state = None
        _free_cuda()
    return EXIT_OK


def _check_generate_args(args: argparse.Namespace) -> None:
    """Usage errors of ``golden generate``, before any model is loaded."""
    count = len(args.checkpoint or []) + len(args.synthetic or [])
    if (args.out or args.name) and count != 1:
        raise UsageError("--out and --name need exactly one model")
    if args.name:
        check_file_name(args.name)
    if args.top_k < 1:
        raise UsageError(f"--top-k must be a positive integer, got {args.top_k}")
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens must be a positive integer, got {args.max_new_tokens}")
    from infer_ref.cli import resolve_device

    resolve_device(args.device)


def _free_cuda() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _run_verify(
    path: str, impl: str, device: str | None, checkpoint: str | None, plant: str | None, quiet: bool
) -> tuple[int, str, Any]:
    """Verify one file with one implementation: (exit code, message, report or None)."""
    from infer_ref import golden

    try:
        doc = golden.load_golden(path)
    except golden.GoldenFormatError as exc:
        return EXIT_FORMAT, str(exc), None
    except (FileNotFoundError, InferRefError) as exc:
        return exit_code_for(exc) or EXIT_MISSING, f"error: {exc}", None
    problem = _device_problem(doc, path, device)
    if problem is not None:
        return EXIT_USAGE, f"error: {problem}", None
    bar = Progress(golden.total_steps(doc), f"verify {Path(path).name} [{impl}]", not quiet)
    ctx = golden.planted_bug(plant) if plant else _null()
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


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _check_outputs(*paths: str | None) -> None:
    """Output paths that can never be written are refused before any work."""
    for path in paths:
        if path is not None:
            check_output_path(path)


def _check_device_option(device: str | None) -> None:
    """``--device`` names a device this machine has (checked once, before any file is read)."""
    from infer_ref.cli import resolve_device

    if device is not None:
        resolve_device(device)


def _device_problem(doc: dict[str, Any], path: str, device: str | None) -> str | None:
    """Why ``doc`` cannot be verified here without ``--device`` (its recorded device is missing), or None."""
    from infer_ref.cli import resolve_device

    if device is not None:  # checked by _check_device_option
        return None
    recorded = doc["run"]["device"]
    try:
        resolve_device(recorded)
    except UsageError:
        return (
            f"{path} records a run on {recorded} ({doc['run']['dtype']}): verifying it needs a {recorded.upper()} "
            f"device and this machine has none: verify it on a machine with one (--device cuda:N picks the card), "
            f"or verify a golden file generated on cpu here (--device cpu against this {recorded} file ends in a "
            "metadata mismatch)"
        )
    return None


def _json_lines(path: Path) -> list[dict[str, Any]]:
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


def _cmd_verify(args: argparse.Namespace) -> int:
    _check_outputs(args.json)
    _check_device_option(args.device)
    worst = EXIT_OK
    results = []
    for path in args.files:
        for impl in args.impl or ["infer_ref"]:
            code, message, report = _run_verify(path, impl, args.device, args.checkpoint, args.plant_bug, args.quiet)
            print(message, flush=True)
            results.append(_result_json(path, impl, code, message, report))
            worst = max(worst, code)
    if args.json:
        atomic_write_text(args.json, json.dumps(results, indent=1) + "\n")
    return worst


def _result_json(path: str, impl: str, code: int, message: str, report: Any) -> dict[str, Any]:
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


# -- report ----------------------------------------------------------------------------------------


def _cmd_report(args: argparse.Namespace) -> int:
    """Verify each file with each implementation and write a markdown report."""

    from infer_ref import golden

    device = args.device
    reuse: dict[tuple[str, str], dict[str, Any]] = {}
    reused_planted: dict[str, Any] | None = None
    _check_outputs(args.out, args.json)
    _check_device_option(device)
    if args.reuse and Path(args.reuse).is_file():
        for line in _json_lines(Path(args.reuse)):
            entry = line
            if "planted_bug" in entry:
                reused_planted = entry
            else:
                reuse[(Path(entry["file"]).name, entry["impl"])] = entry
    rows: list[dict[str, Any]] = []
    files_meta: list[dict[str, Any]] = []
    worst = EXIT_OK
    t_all = time.perf_counter()
    for path in args.files:
        try:
            doc = golden.load_golden(path)
        except golden.GoldenFormatError as exc:
            rows.append({"file": path, "impl": "-", "code": EXIT_FORMAT, "message": str(exc)})
            worst = max(worst, EXIT_FORMAT)
            continue
        problem = _device_problem(doc, path, device)
        if problem is not None:
            print(f"error: {problem}", flush=True)  # as verify prints each file's verdict
            rows.append({"file": path, "impl": "all", "code": EXIT_USAGE, "message": f"error: {problem}"})
            worst = max(worst, EXIT_USAGE)
            continue
        dev = device or doc["run"]["device"]
        source = golden.ModelSource.from_golden(doc)
        margins = [
            s["top_logprobs"][0] - s["top_logprobs"][1] for c in doc["cases"] for s in c["steps"] if len(s["top_logprobs"]) > 1
        ]
        files_meta.append(
            {
                "file": path,
                "model": doc["model"]["name"],
                "source": doc["model"]["source"],
                "cases": ", ".join(f"{c['name']} ({len(c['prompt_ids'])}+{len(c['steps'])})" for c in doc["cases"]),
                "margins": golden.margin_percentiles(margins),
                "generated_on": f"{doc['run']['device_name']}, torch {doc['run']['torch']}, transformers {doc['run']['transformers']}",
            }
        )
        try:
            golden.check_metadata(doc, source, dtype=doc["run"]["dtype"], device=dev, path=path)
        except golden.GoldenMetadataMismatch as exc:
            rows.append({"file": path, "impl": "all", "code": EXIT_METADATA, "message": str(exc)})
            worst = max(worst, EXIT_METADATA)
            continue
        hf_model = None
        for impl in args.impl:
            reused = reuse.get((Path(path).name, impl))
            if reused is not None:
                report = golden.VerifyReport.from_dict(reused["report"])
                code = EXIT_OK if report.ok else EXIT_MISMATCH
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
            bar = Progress(golden.total_steps(doc), f"report {Path(path).name} [{impl}]", not args.quiet)
            report = golden.verify(doc, sessions, impl=impl, device=dev, path=path, progress=bar)
            bar.close()
            code = EXIT_OK if report.ok else EXIT_MISMATCH
            if impl != "transformers-uncached":  # the uncached run measures noise; it is not a gate
                worst = max(worst, code)
            message = report.summary() if report.ok else golden.format_failure(report)
            print(message, flush=True)
            rows.append({"file": path, "impl": impl, "code": code, "report": report, "seconds": time.perf_counter() - t0, "message": message})
        del hf_model
        source._state = None
        _free_cuda()

    planted: dict[str, Any] | None = None
    if args.plant_bug and reused_planted is not None and reused_planted["planted_bug"] == args.plant_bug:
        planted = {"bug": args.plant_bug, "file": reused_planted["file"], "code": reused_planted["code"], "message": reused_planted["message"]}
        if planted["code"] != EXIT_MISMATCH:
            worst = max(worst, EXIT_MISMATCH)
    elif args.plant_bug:
        target = args.plant_bug_file or args.files[-1]
        code, message, _ = _run_verify(target, "infer_ref", device, None, args.plant_bug, args.quiet)
        planted = {"bug": args.plant_bug, "file": target, "code": code, "message": message}
        print(f"planted bug {args.plant_bug!r} on {target}: exit {code}", flush=True)
        if code != EXIT_MISMATCH:
            worst = max(worst, EXIT_MISMATCH)  # the bug must be caught as a real mismatch

    text = _markdown(rows, files_meta, planted, device, time.perf_counter() - t_all, args)
    out = atomic_write_text(args.out, text)
    print(f"wrote {out}")
    if args.json:
        data = [
            _result_json(r["file"], r["impl"], r["code"], r["message"], r.get("report")) for r in rows
        ] + ([{"planted_bug": planted}] if planted else [])
        atomic_write_text(args.json, json.dumps(data, indent=1, default=str) + "\n")
    return worst


def _fmt(x: float) -> str:
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return str(x)
    return f"{x:.3g}"


def _markdown(
    rows: list[dict[str, Any]],
    files_meta: list[dict[str, Any]],
    planted: dict[str, Any] | None,
    device: str | None,
    seconds: float,
    args: argparse.Namespace,
) -> str:
    import platform

    import torch
    import transformers

    from infer_ref import golden

    dev = device or "cuda" if torch.cuda.is_available() else "cpu"
    lines = [
        "# Golden files: verification report",
        "",
        f"Written by `python -m infer_ref.golden_cli report` on {datetime.date.today().isoformat()} "
        f"({seconds:.0f} s). Regenerate with `scripts/gpu_goldens.sh`.",
        "",
        f"- device: {golden.device_name(dev)}",
        f"- torch {torch.__version__}, transformers {transformers.__version__}, python {platform.python_version()}",
        "",
        "Verification is teacher-forced through each implementation's own KV cache: a step passes when the "
        "golden token's logprob is within eps of the implementation's best (tie-aware) and the golden top-k "
        "logprobs are within the top-k tolerance. *Free-running match* is the number of leading steps whose "
        "argmax equals the golden token (what greedy decoding would reproduce exactly). *Max deficit* is the "
        "largest (our best logprob - our logprob of the golden token). *Min margin* is the smallest golden "
        "top1-top2 logprob gap. `transformers-uncached` recomputes the full sequence at every step: it measures "
        "the cached-vs-uncached noise of the dtype and is reported, not gated.",
        "",
        "## Tolerances",
        "",
        "| dtype | eps | top-k atol | why |",
        "|---|---|---|---|",
    ]
    for name, tol in golden.TOLERANCES.items():
        lines.append(f"| {name} | {tol.eps} | {tol.topk_atol} | {tol.why} |")
    lines += ["", "## Results", "", "| golden file | impl | result | free-running match per case | max abs dlogprob | max deficit | min margin | s |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        rep = r.get("report")
        name = Path(r["file"]).name
        if rep is None:
            first = r["message"].splitlines()[0]
            lines.append(f"| {name} | {r['impl']} | ERROR (exit {r['code']}): {first} | | | | | |")
            continue
        match = ", ".join(f"{c.free_match}/{c.steps}" for c in rep.cases)
        status = "pass" if rep.ok else "**FAIL**"
        lines.append(
            f"| {name} | {r['impl']} | {status} | {match} | {_fmt(rep.max_abs_dlogprob)} | {_fmt(rep.max_deficit)} "
            f"| {_fmt(rep.min_golden_margin)} | {r['seconds']:.0f} |"
        )
    lines += [
        "",
        "## Golden margin distribution (top1 - top2 logprob, nats, over all steps)",
        "",
        "| golden file | model | cases (prompt+new) | min | p1 | p5 | p25 | median | generated on |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for m in files_meta:
        pct = " | ".join(_fmt(v) for v in m["margins"])
        lines.append(f"| {Path(m['file']).name} | {m['model']} ({m['source']}) | {m['cases']} | {pct} | {m['generated_on']} |")
    if planted:
        verdict = (
            "caught: verification fails with a real mismatch (GoldenMismatch)"
            if planted["code"] == EXIT_MISMATCH
            else f"NOT caught as a mismatch (exit {planted['code']})"
        )
        lines += [
            "",
            f"## Planted bug: `{planted['bug']}`",
            "",
            f"infer_ref with the bug planted, verified against `{Path(planted['file']).name}`: {verdict}. The message:",
            "",
            "```",
            planted["message"],
            "```",
        ]
    failures = [r for r in rows if r.get("report") is not None and not r["report"].ok] + [
        r for r in rows if r.get("report") is None
    ]
    if failures:
        lines += ["", "## Failure details", ""]
        for r in failures:
            lines += ["```", r["message"], "```", ""]
    if getattr(args, "pytest_log", None) and Path(args.pytest_log).is_file():
        tail = Path(args.pytest_log).read_text(encoding="utf-8", errors="replace").strip().splitlines()[-15:]
        lines += ["", "## GPU-tier golden tests (`pytest -m gpu tests/golden`), last lines", "", "```", *tail, "```"]
    return "\n".join(lines) + "\n"


# -- wiring ----------------------------------------------------------------------------------------


def add_golden_commands(subparsers: argparse._SubParsersAction) -> None:
    """Add ``golden generate|verify|report`` to a CLI's subparsers.

    Each leaf parser sets ``func``: exit with ``run(args.func, args)`` (or ``args.func(args)``,
    which lets a missing file raise FileNotFoundError).
    """
    from infer_ref import golden

    parser = subparsers.add_parser(
        "golden",
        help="write golden token files from transformers, verify implementations against them",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="golden_command", required=True, metavar="{generate,verify,report}")

    gen = sub.add_parser("generate", help="write a golden file with transformers (greedy)")
    what = gen.add_mutually_exclusive_group(required=True)
    what.add_argument("--checkpoint", nargs="+", help="local HF snapshot folder(s) with PROVENANCE.json (canonical prompts)")
    what.add_argument("--synthetic", nargs="+", choices=sorted(golden.SYNTHETIC_MODELS), help="seeded synthetic model(s)")
    gen.add_argument("--name", help="model name in the file and file name (default: folder or synthetic name)")
    gen.add_argument("--dtype", default="float32", choices=sorted(golden.DTYPES))
    gen.add_argument("--device", default="cpu")
    gen.add_argument("--out", help="output file (default: OUT_DIR/<name>.<device>-<dtype>.json)")
    gen.add_argument("--out-dir", default=str(golden.GOLDEN_DIR))
    gen.add_argument("--top-k", type=int, default=golden.DEFAULT_TOP_K)
    gen.add_argument("--max-new-tokens", type=int, default=None, help="override the per-prompt default")
    gen.add_argument("--force", action="store_true", help="overwrite an existing golden file")
    gen.add_argument("--quiet", action="store_true", help="no progress bar")
    gen.set_defaults(func=_cmd_generate)

    ver = sub.add_parser("verify", help="verify implementation(s) against golden file(s), teacher-forced")
    ver.add_argument("files", nargs="+")
    ver.add_argument("--impl", action="append", type=_impl, metavar="IMPL",
                     help=f"{', '.join(golden.IMPLEMENTATIONS)} or a conformance adapter module:OBJECT; repeatable (default infer_ref)")
    ver.add_argument("--device", default=None, help="default: the file's device type")
    ver.add_argument("--checkpoint", default=None, help="override the checkpoint folder recorded in the file")
    ver.add_argument("--plant-bug", choices=sorted(golden.PLANTED_BUGS), default=None, help="plant a known bug into infer_ref first")
    ver.add_argument("--json", default=None, help="also write the results as JSON here")
    ver.add_argument("--quiet", action="store_true")
    ver.set_defaults(func=_cmd_verify)

    rep = sub.add_parser("report", help="verify files with several implementations and write a markdown report")
    rep.add_argument("files", nargs="+")
    rep.add_argument("--impl", nargs="+", default=list(golden.IMPLEMENTATIONS), choices=golden.IMPLEMENTATIONS)
    rep.add_argument("--device", default=None)
    rep.add_argument("--out", default="docs/golden_report.md")
    rep.add_argument("--json", default=None)
    rep.add_argument("--plant-bug", choices=sorted(golden.PLANTED_BUGS), default=None)
    rep.add_argument("--plant-bug-file", default=None, help="golden file for the planted-bug check (default: the last)")
    rep.add_argument("--pytest-log", default=None, help="include the tail of this pytest log")
    rep.add_argument("--reuse", default=None, help="JSON lines of results already computed (by the GPU tests) to reuse")
    rep.add_argument("--quiet", action="store_true")
    rep.set_defaults(func=_cmd_report)


def _impl(value: str) -> str:
    """A built-in implementation name or ``module:OBJECT`` (a conformance adapter)."""
    if value in golden_implementations() or ":" in value:
        return value
    raise argparse.ArgumentTypeError(f"{value!r}: expected one of {', '.join(golden_implementations())} or module:OBJECT")


def golden_implementations() -> tuple[str, ...]:
    from infer_ref import golden

    return golden.IMPLEMENTATIONS


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infer_ref.golden_cli", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    add_golden_commands(sub)
    # Standalone: accept both `golden_cli generate ...` and `golden_cli golden generate ...`.
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("golden", "-h", "--help"):
        argv = ["golden", *argv]
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    return run(func, args)


def run(func: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Call a command; a user error becomes one line and its exit status (``infer_ref.errors``)."""
    return run_reporting_user_errors(lambda: func(args), "infer-ref golden")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
