"""``infer-ref golden generate``: write golden files from transformers (greedy)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from infer_ref.cli.golden.shared import Progress, free_cuda, golden_margins
from infer_ref.cli.options import UsageError, check_device
from infer_ref.errors import EXIT_OK, OverwriteRefused
from infer_ref.fileio import check_file_name
from infer_ref.paths import require_snapshot, resolve_model_path


def cmd_generate(args: argparse.Namespace) -> int:
    _check_generate_args(args)
    from infer_ref.conformance.oracles import golden

    sources = [golden.ModelSource.checkpoint(p) for p in args.checkpoint or []]
    sources += [golden.ModelSource.synthetic(n) for n in args.synthetic or []]
    if args.name:
        sources[0].name = args.name
    out_dir = Path(args.out_dir) if args.out_dir else golden.GOLDEN_DIR
    top_k = golden.DEFAULT_TOP_K if args.top_k is None else args.top_k
    outs = [
        Path(args.out) if args.out else golden.default_golden_path(src.name, args.dtype, args.device, out_dir)
        for src in sources
    ]
    _check_outputs(outs, args.force)  # every output, before anything is generated (minutes for a real model)
    for source, out in zip(sources, outs, strict=True):
        prompts = source.prompts()
        total = sum(args.max_new_tokens or p.get("max_new_tokens") or 64 for p in prompts)
        bar = Progress(total, f"generate {out.name}", not args.quiet)
        doc = golden.write_golden(
            source,
            dtype=args.dtype,
            device=args.device,
            top_k=top_k,
            max_new_tokens=args.max_new_tokens,
            progress=bar,
            log=None if args.quiet else (lambda m: print(f"  {m}", file=sys.stderr, flush=True)),
        )
        seconds = bar.close()
        golden.dump_golden(doc, out, force=args.force)
        steps = golden.total_steps(doc)
        pct = golden.margin_percentiles(golden_margins(doc))
        print(
            f"wrote {out}: {len(doc['cases'])} prompt(s), {steps} steps in {seconds:.1f}s; golden margin "
            f"min {pct[0]:.3g} p1 {pct[1]:.3g} p5 {pct[2]:.3g} median {pct[4]:.3g}",
            flush=True,
        )
        source._state = None
        free_cuda()
    return EXIT_OK


def _check_outputs(outs: list[Path], force: bool) -> None:
    """Output paths that are folders, or files that exist without ``--force``, are refused."""
    folders = [str(o) for o in outs if o.is_dir()]
    if folders:
        raise UsageError(f"output path(s) {', '.join(folders)} are folders: expected golden file paths")
    existing = [str(o) for o in outs if o.exists()]
    if existing and not force:
        raise OverwriteRefused(f"{', '.join(existing)} exist(s); pass --force to overwrite golden files")


def _check_generate_args(args: argparse.Namespace) -> None:
    """Usage errors of ``golden generate``, before any model is loaded."""
    count = len(args.checkpoint or []) + len(args.synthetic or [])
    if (args.out or args.name) and count != 1:
        raise UsageError("--out and --name need exactly one model")
    if args.name:
        check_file_name(args.name)
    if args.top_k is not None and args.top_k < 1:
        raise UsageError(f"--top-k must be a positive integer, got {args.top_k}")
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens must be a positive integer, got {args.max_new_tokens}")
    if args.out:  # the default paths need the golden package: checked once it is imported
        _check_outputs([Path(args.out)], args.force)
    check_device(args.device)
    for folder in args.checkpoint or []:
        require_snapshot(resolve_model_path(folder), "--checkpoint")
