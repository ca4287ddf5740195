"""``infer-ref golden generate|verify|report``: write golden files from transformers, check them.

Also runs standalone: ``python -m infer_ref.cli.golden generate|verify|report ...``.

Exit codes (``docs/errors.md``): 0 pass · 1 golden mismatch (a real numerical disagreement) · 2 usage
error · 3 not a readable golden file (schema, counts, ids, non-finite values, content digest) or a
bad checkpoint · 4 refused to overwrite an existing file (pass ``--force``) · 5 a file or checkpoint
folder is missing · 6 metadata mismatch (the file describes other weights, config, dtype or device).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from infer_ref.cli.golden.generate import cmd_generate
from infer_ref.cli.golden.report import cmd_report
from infer_ref.cli.golden.shared import EXIT_EXISTS, EXIT_FORMAT, EXIT_MISMATCH
from infer_ref.cli.golden.verify import cmd_verify
from infer_ref.cli.options import DTYPES, OneLineParser, run_command
from infer_ref.conformance.checkpoints.golden_names import (
    IMPLEMENTATIONS,
    PLANTED_BUGS,
    SYNTHETIC_MODEL_NAMES,
)
from infer_ref.errors import EXIT_METADATA, EXIT_MISSING, EXIT_OK, EXIT_USAGE

__all__ = [
    "EXIT_EXISTS", "EXIT_FORMAT", "EXIT_METADATA", "EXIT_MISMATCH", "EXIT_MISSING", "EXIT_OK", "EXIT_USAGE",
    "add_golden_commands", "main", "run",
]

PROG = "python -m infer_ref.cli.golden"  # standalone; under `infer-ref`, its errors are infer-ref's


def add_golden_commands(subparsers: argparse._SubParsersAction) -> None:
    """Add ``golden generate|verify|report`` to a CLI's subparsers.

    Each leaf parser sets ``run``: exit with ``run(args.run, args)`` (or ``args.run(args)``,
    which lets a missing file raise FileNotFoundError). Nothing here imports the golden package
    (torch): the names its options take come from ``golden_names``, and the defaults that live in
    the package are applied by the commands.
    """
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
    what.add_argument("--synthetic", nargs="+", choices=sorted(SYNTHETIC_MODEL_NAMES), metavar="NAME",
                      help="seeded synthetic model(s): %(choices)s")
    gen.add_argument("--name", help="model name in the file and file name (default: folder or synthetic name)")
    gen.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    gen.add_argument("--device", default="cpu")
    gen.add_argument("--out", help="output file (default: OUT_DIR/<name>.<device>-<dtype>.json)")
    gen.add_argument("--out-dir", default=None, help="default: the fixtures' golden folder (fixtures/golden)")
    gen.add_argument("--top-k", type=int, default=None, help="top-k ids and logprobs kept per step (default: 10)")
    gen.add_argument("--max-new-tokens", type=int, default=None, help="override the per-prompt default")
    gen.add_argument("--force", action="store_true", help="overwrite an existing golden file")
    gen.add_argument("--quiet", action="store_true", help="no progress bar")
    gen.set_defaults(run=cmd_generate)

    ver = sub.add_parser("verify", help="verify implementation(s) against golden file(s), teacher-forced")
    ver.add_argument("files", nargs="+")
    ver.add_argument("--impl", action="append", type=_impl, metavar="IMPL",
                     help="a built-in implementation (infer_ref, the default; `golden report --help` lists them all) or a "
                          "conformance adapter module:OBJECT; repeatable")
    ver.add_argument("--device", default=None, help="default: the file's device type")
    ver.add_argument("--checkpoint", default=None, help="override the checkpoint folder recorded in the file")
    ver.add_argument("--plant-bug", choices=sorted(PLANTED_BUGS), default=None, metavar="BUG",
                     help="plant a known bug into infer_ref first: %(choices)s")
    ver.add_argument("--json", default=None, help="also write the results as JSON here")
    ver.add_argument("--quiet", action="store_true")
    ver.set_defaults(run=cmd_verify)

    rep = sub.add_parser("report", help="verify files with several implementations and write a markdown report")
    rep.add_argument("files", nargs="+")
    rep.add_argument("--impl", nargs="+", default=None, choices=IMPLEMENTATIONS, metavar="IMPL",
                     help="implementations to verify with: %(choices)s (default: all)")
    rep.add_argument("--device", default=None)
    rep.add_argument("--out", default="docs/golden_report.md")
    rep.add_argument("--json", default=None)
    rep.add_argument("--plant-bug", choices=sorted(PLANTED_BUGS), default=None, metavar="BUG", help="%(choices)s")
    rep.add_argument("--plant-bug-file", default=None, help="golden file for the planted-bug check (default: the last)")
    rep.add_argument("--pytest-log", default=None, help="include the tail of this pytest log")
    rep.add_argument("--reuse", default=None, help="JSON lines of results already computed (by the GPU tests) to reuse")
    rep.add_argument("--quiet", action="store_true")
    rep.set_defaults(run=cmd_report)


def _impl(value: str) -> str:
    """A built-in implementation name or ``module:OBJECT`` (a conformance adapter)."""
    if ":" in value or value in IMPLEMENTATIONS:  # module:OBJECT is imported and checked by the command
        return value
    raise argparse.ArgumentTypeError(f"{value!r}: expected one of {', '.join(IMPLEMENTATIONS)} or module:OBJECT")


def main(argv: Sequence[str] | None = None) -> int:
    # Standalone: accept both `... generate ...` and `... golden generate ...`.
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("golden", "-h", "--help"):
        argv = ["golden", *argv]
    return run_command(lambda: _parse_and_run(argv), PROG)


def _parse_and_run(argv: list[str]) -> int:
    parser = OneLineParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    add_golden_commands(sub)
    args = parser.parse_args(argv)
    command: Callable[[argparse.Namespace], int] = args.run
    return command(args)


def run(func: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Call a command; a user error becomes one line and its exit status (``infer_ref.errors``)."""
    return run_command(lambda: func(args), PROG)
