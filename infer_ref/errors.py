"""The error families of infer_ref and the exit code each one maps to in the CLIs.

Every error a user can cause derives from :class:`InferRefError`, so a command line can turn
exactly those into one line and a documented exit status while a bug (any other exception) still
shows its traceback. The families also derive from the built-in class a caller would expect
(``ValueError``, ``FileExistsError``), so ``except ValueError`` keeps working. ``docs/errors.md``
lists them with what is validated where.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

EXIT_OK = 0
EXIT_FAILED_CHECK = 1  # a verification ran and found a real disagreement (golden mismatch)
EXIT_USAGE = 2  # bad command-line arguments or parameters
EXIT_BAD_DATA = 3  # a checkpoint, config, tokenizer or golden file that cannot be used as it is
EXIT_REFUSED_OVERWRITE = 4  # an output exists and --force was not given
EXIT_MISSING = 5  # a file or folder named on the command line does not exist
EXIT_METADATA = 6  # a golden file describes another run (weights, config, dtype, device)
EXIT_NOT_JUDGED = 7  # infer-ref conformance: no failure, but some test judged nothing (the engine never started)
EXIT_INTERNAL = 70  # infer-ref conformance: pytest or a plugin broke (a bug; its traceback is printed)


class InferRefError(Exception):
    """Base of every error a user can cause: caught by the CLIs, reported in one line."""

    exit_code = EXIT_USAGE


class UsageError(InferRefError, ValueError):
    """A bad argument or parameter: what was given and what is expected."""

    exit_code = EXIT_USAGE


class DataError(InferRefError, ValueError):
    """A file or tensor that infer_ref cannot compute a correct answer from."""

    exit_code = EXIT_BAD_DATA


class NonFiniteError(DataError):
    """A NaN or infinity where it would decide an answer (logits, weights, golden log-probs)."""


class EngineUnavailable(InferRefError, RuntimeError):
    """``infer-ref conformance``: the engine cannot be started or reached (not installed, nothing
    answers at the endpoint, its factory raised at the start): nothing could be judged."""

    exit_code = EXIT_NOT_JUDGED


class OverwriteRefused(InferRefError, FileExistsError):
    """An output file exists and overwriting was not asked for."""

    exit_code = EXIT_REFUSED_OVERWRITE


def exit_code_for(error: BaseException) -> int | None:
    """The documented exit status of a user error, or None for anything else (a bug)."""
    if isinstance(error, InferRefError):
        return error.exit_code
    if isinstance(error, FileExistsError):
        return EXIT_REFUSED_OVERWRITE
    if isinstance(error, (FileNotFoundError, NotADirectoryError, IsADirectoryError)):
        return EXIT_MISSING
    return None


EXIT_INTERRUPTED = 130  # Ctrl-C
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: the reader went away (`infer-ref ... | head`), as shell tools report it


def run_reporting_user_errors(call: Callable[[], int], prog: str) -> int:
    """Run a command; a user error becomes one line on stderr and its documented exit status.

    Only user errors are caught (:func:`exit_code_for`): any other exception is a bug and keeps
    its traceback. A closed output pipe ends the command quietly.
    """
    try:
        return call()
    except BrokenPipeError:
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as err:
        code = exit_code_for(err)
        if code is None:
            raise
        message = str(err).strip() or type(err).__name__
        print(f"{prog}: error: {message}", file=sys.stderr)
        return code


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's final flush does not raise again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
