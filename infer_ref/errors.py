"""The error families of infer_ref and the exit code each one maps to in the CLIs.

Every error a user can cause derives from :class:`InferRefError`, so a command line can turn
exactly those into one line and a documented exit status while a bug (any other exception) still
shows its traceback. The families also derive from the built-in class a caller would expect
(``ValueError``, ``FileExistsError``), so ``except ValueError`` keeps working. ``docs/errors.md``
lists them with what is validated where.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED_CHECK = 1  # a verification ran and found a real disagreement (golden mismatch)
EXIT_USAGE = 2  # bad command-line arguments or parameters
EXIT_BAD_DATA = 3  # a checkpoint, config, tokenizer or golden file that cannot be used as it is
EXIT_REFUSED_OVERWRITE = 4  # an output exists and --force was not given
EXIT_MISSING = 5  # a file or folder named on the command line does not exist
EXIT_METADATA = 6  # a golden file describes another run (weights, config, dtype, device)


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
