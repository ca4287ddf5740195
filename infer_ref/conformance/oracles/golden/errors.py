"""The errors of golden-file handling, each with the exit status the CLIs give it.

A numerical disagreement, :class:`~infer_ref.conformance.oracles.golden.results.GoldenMismatch`,
carries the verification's report and lives beside it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from infer_ref.errors import EXIT_BAD_DATA, EXIT_METADATA, DataError, InferRefError


class GoldenError(InferRefError):
    """Base class of golden-file errors."""


class GoldenFormatError(GoldenError, DataError):
    """Not a golden file this version of infer_ref can read: schema, format version, counts, id
    ranges, non-finite values or a content digest that does not match (a truncated, edited or
    duplicated file). CLI exit status 3."""

    exit_code = EXIT_BAD_DATA


class GoldenMetadataMismatch(GoldenError):
    """The golden file describes a different run (weights, config, dtype, device type).

    Not an implementation bug: the inputs drifted. ``fields`` maps each differing field to
    ``(value in the file, value of this run)``. CLI exit status 6.
    """

    exit_code = EXIT_METADATA

    def __init__(self, path: str, fields: Mapping[str, tuple[Any, Any]]) -> None:
        self.path = path
        self.fields = dict(fields)
        lines = [
            f"golden file {path} does not describe this run (metadata mismatch, not a numerical "
            f"mismatch: nothing was compared). Differing field(s): {', '.join(self.fields)}"
        ]
        for name, (golden, run) in self.fields.items():
            lines.append(f"  {name}: golden file has {short_repr(golden)}, this run has {short_repr(run)}")
        lines.append(
            "  If the change is intended, regenerate the file with `infer-ref golden generate ... --force`."
        )
        super().__init__("\n".join(lines))


def short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
