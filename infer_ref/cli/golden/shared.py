"""What the ``golden`` commands share: their exit codes, the progress bar, freeing GPU memory."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from infer_ref.cli.options import check_device
from infer_ref.errors import (
    EXIT_BAD_DATA,
    EXIT_FAILED_CHECK,
    EXIT_METADATA,
    EXIT_REFUSED_OVERWRITE,
    UsageError,
)

EXIT_MISMATCH = EXIT_FAILED_CHECK
EXIT_FORMAT = EXIT_BAD_DATA
EXIT_EXISTS = EXIT_REFUSED_OVERWRITE

__all__ = [
    "EXIT_EXISTS", "EXIT_FORMAT", "EXIT_METADATA", "EXIT_MISMATCH", "Progress", "check_golden_files", "device_problem",
    "free_cuda", "golden_margins",
]


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


def free_cuda() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def golden_margins(doc: dict[str, Any]) -> list[float]:
    """The golden top1 - top2 logprob gap of every step of a golden file that records two or more."""
    return [
        s["top_logprobs"][0] - s["top_logprobs"][1] for c in doc["cases"] for s in c["steps"] if len(s["top_logprobs"]) > 1
    ]


def check_golden_files(paths: list[str]) -> None:
    """Every golden file named is there, checked before any is verified (and before torch is imported)."""
    for path in paths:
        if not Path(path).exists():
            raise FileNotFoundError(f"{path}: no such file (expected a golden file written by `infer-ref golden generate`)")


def device_problem(doc: dict[str, Any], path: str, device: str | None) -> str | None:
    """Why ``doc`` cannot be verified here without ``--device`` (its recorded device is missing), or None."""
    if device is not None:  # checked by check_device_option
        return None
    recorded = doc["run"]["device"]
    try:
        check_device(recorded)
    except UsageError:
        return (
            f"{path} records a run on {recorded} ({doc['run']['dtype']}): verifying it needs a {recorded.upper()} "
            f"device and this machine has none: verify it on a machine with one (--device cuda:N picks the card), "
            f"or verify a golden file generated on cpu here (--device cpu against this {recorded} file ends in a "
            "metadata mismatch)"
        )
    return None
