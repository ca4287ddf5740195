"""The ``infer-ref`` command: one parser over the commands, and the dispatch to them.

``infer-ref generate [PROMPT]`` runs the embedded llama-tiny fixture when no ``--model`` is given,
streams tokens as they are produced and ends with a metrics block. Every user error prints one
line and exits with a documented status (``docs/errors.md``): 2 usage (unknown model, bad dtype,
device or sampling parameter, a prompt too long for the model), 3 a bad checkpoint or data
(unreadable files, NaN weights or logits), 4 a refused overwrite, 5 a missing file. A bug still
shows its traceback; a closed output pipe ends the command quietly.

Each command module adds its parser and sets ``run`` (the function to call) and, for a command
that hands unknown options on, ``pass_through``. Every error line starts ``infer-ref: error:``,
argparse's refusals too (:class:`~infer_ref.cli.options.OneLineParser`).

Only the command named on the line gets its whole parser (its module imported); the others are
listed by name and help, so ``infer-ref --help`` and a usage error answer before torch or any
command's library is imported.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from infer_ref.cli.options import EXIT_USAGE, OneLineParser, run_command

PROG = "infer-ref"  # the name every error line of every command starts with

# name -> (help, "module:function that adds the command's parser")
COMMANDS = {
    "generate": ("generate text from a prompt", "infer_ref.cli.generate:add_generate_command"),
    "golden": ("write golden token files from transformers, verify implementations against them",
               "infer_ref.cli.golden:add_golden_commands"),
    "conformance": ("run the conformance tests against an implementation or an engine",
                    "infer_ref.cli.conformance:add_conformance_command"),
}
DESCRIPTION = ("infer_ref's command line: generate with a reference model (the embedded llama-tiny by default), "
               "write and verify golden token files, and judge an implementation or an engine with the conformance "
               "suite. `infer-ref COMMAND --help` describes each command.")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    return run_command(lambda: _parse_and_run(argv), PROG)  # a usage error, argparse's too, is one line


def _parse_and_run(argv: list[str]) -> int:
    parser = build_parser(_command_named(argv))
    args, extra = parser.parse_known_args(argv)
    pass_through = getattr(args, "pass_through", False)  # conformance: unknown options go to pytest
    if extra and not pass_through:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if not hasattr(args, "run"):
        parser.print_help()
        return EXIT_USAGE
    if pass_through:
        return int(args.run(args, extra))
    return int(args.run(args))


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``infer-ref`` parser; ``command`` (or every command, when None) gets its whole parser."""
    parser = OneLineParser(prog=PROG, description=DESCRIPTION)
    commands = parser.add_subparsers(title="commands")
    for name, (help_text, target) in COMMANDS.items():
        if command is None or name == command:
            module, _, function = target.partition(":")
            getattr(importlib.import_module(module), function)(commands)
        else:
            commands.add_parser(name, help=help_text)
    return parser


def _command_named(argv: Sequence[str]) -> str:
    """The command this line runs: its first word that is a command's name ('' when none is)."""
    for word in argv:
        if word in COMMANDS:
            return word
        if not word.startswith("-"):
            break
    return ""
