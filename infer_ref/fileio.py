"""Writing output files safely: atomically, never over a folder, never outside the folder asked for."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from infer_ref.errors import OverwriteRefused, UsageError


def atomic_write_text(path: str | os.PathLike[str], text: str, *, overwrite: bool = True) -> Path:
    """Write ``text`` to ``path`` through a temporary file in the same folder, renamed into place.

    A reader sees the old file or the new one, never half of one; a failed write leaves no
    temporary file behind. A folder at ``path`` is refused (:class:`UsageError`), and so is an
    existing file unless ``overwrite`` (:class:`OverwriteRefused`).
    """
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"output path {path} is a folder: expected a file path")
    if path.exists() and not overwrite:
        raise OverwriteRefused(f"{path} exists; pass --force (force=True) to overwrite it")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise UsageError(f"cannot create the folder of {path}: a parent is a file") from None
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def replace_between_markers(path: str | os.PathLike[str], name: str, block: str) -> None:
    """Rewrite the text between ``<!-- NAME:start -->`` and ``<!-- NAME:end -->`` in ``path`` (a
    generated block of a page); the markers must be there."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    text = Path(path).read_text()
    if start not in text or end not in text:
        raise UsageError(f"{path}: no {start} ... {end} block to replace")
    head, _, rest = text.partition(start)
    _, _, tail = rest.partition(end)
    atomic_write_text(path, f"{head}{start}\n{block}\n{end}{tail}")


def check_output_path(path: str | os.PathLike[str]) -> Path:
    """``path`` as a :class:`Path` when a file can be written there, checked before any work.

    Refused: a folder (or a name ending in a separator, which names one) as :class:`UsageError`; a
    path whose folder does not exist as ``FileNotFoundError`` naming that folder (the results of a
    long run would otherwise be lost at its end, or written somewhere the user did not mean).
    """
    text = os.fspath(path)
    out = Path(text)
    if out.is_dir() or text.endswith(("/", os.sep)):
        raise UsageError(f"output path {text} is a folder: expected a file path")
    folder = out.parent
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"output path {text}: {folder} is a file, not a folder")
    if not folder.is_dir():
        raise FileNotFoundError(f"output path {text}: the folder {folder} does not exist (create it first)")
    return out


def check_file_name(name: str, what: str = "--name") -> str:
    """``name`` when it is a plain file name (no folder part, not ``.``/``..``), else :class:`UsageError`."""
    if not isinstance(name, str) or not name or name in (".", "..") or "\0" in name or Path(name).name != name or "\\" in name:
        raise UsageError(f"{what} {name!r} must be a plain file name without a folder part (it names a file inside the output folder)")
    return name
