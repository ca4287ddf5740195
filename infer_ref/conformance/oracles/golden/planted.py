"""Known bugs planted into infer_ref, to show that golden files catch them.

A planted bug is one of the kit's mutants (:mod:`infer_ref.conformance.mutants`): a complete adapter
whose model *instances* carry the bug, so nothing global is patched and the bug reaches exactly the
verification that asked for it. Inside ``with planted_bug(name):`` a verification of the built-in
implementation ``infer_ref`` runs through that mutant's adapter instead (:func:`planted_impl`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

from infer_ref.conformance.checkpoints.golden_names import PLANTED_BUGS

_planted: ContextVar[str | None] = ContextVar("planted_bug", default=None)


@contextlib.contextmanager
def planted_bug(name: str) -> Iterator[None]:
    """Verify infer_ref with the known bug ``name`` planted, for the verifications inside the block."""
    if name not in PLANTED_BUGS:
        raise KeyError(f"unknown planted bug {name!r}; known: {', '.join(PLANTED_BUGS)}")
    token = _planted.set(PLANTED_BUGS[name])
    try:
        yield
    finally:
        _planted.reset(token)


def planted_impl(impl: str) -> str:
    """The implementation to verify for ``impl``: the planted mutant's adapter in place of ``infer_ref``
    inside :func:`planted_bug`, else ``impl`` itself."""
    mutant = _planted.get()
    return mutant if mutant is not None and impl == "infer_ref" else impl
