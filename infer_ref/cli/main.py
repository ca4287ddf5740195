"""The ``infer-ref`` command: one parser over the commands, and the dispatch to them.

``infer-ref generate [PROMPT]`` runs the embedded llama-tiny fixture when no ``--model`` is given,
streams tokens as they are produced and ends with a metrics block. Every user error prints one
line and exits with a documented status (``docs/errors.md``): 2 usage (unknown model, bad dtype,
device or sampling parameter, a prompt too long for the model), 3 a bad checkpoint or data
(unreadable files, NaN weights or logits), 4 a refused overwrite, 5 a missing file. A bug still
shows its traceback; a closed output pipe ends the command quietly.

Each command module adds its parser and sets ``run`` (the function to call), ``prog`` (the name
its errors are reported under) and, for a command that hands unknown options on, ``pass_through``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from infer_ref.cli.conformance import add_conformance_command
from infer_ref.cli.generate import add_generate_command
from infer_ref.cli.golden import add_golden_commands
from infer_ref.cli.options import EXIT_USAGE, run_command


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    pass_through = getattr(args, "pass_through", False)  # conformance: unknown options go to pytest
    if extra and not pass_through:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if not hasattr(args, "run"):
        parser.print_help()
        return EXIT_USAGE
    if pass_through:
        return run_command(lambda: int(args.run(args, extra)), args.prog)
    return run_command(lambda: int(args.run(args)), args.prog)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="infer-ref", description="The ``infer-ref`` command.")
    commands = parser.add_subparsers(title="commands")
    add_generate_command(commands)
    add_golden_commands(commands)
    add_conformance_command(commands)
    return parser
