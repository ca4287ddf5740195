"""Kernel tests: the Triton interpreter shim for ``TRITON_INTERPRET=1`` runs.

Triton's interpreter (3.5, 3.6) holds every scalar as a one-element 1-D numpy array and turns it into a
Python int with ``int(array)``, which numpy >= 2.4 refuses for arrays with a dimension. Any kernel
whose loop bound is a runtime argument then fails under the interpreter (never on a GPU). The shim
wraps the interpreter's tensor patching so ``__index__`` reads the single element with ``.item()``;
it changes nothing else, and nothing at all unless ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import os
from typing import Any


def _install_interpreter_index_shim() -> None:
    try:
        from triton.runtime import interpreter
    except ImportError:
        return
    original = interpreter._patch_lang_tensor
    if getattr(original, "_infer_ref_shim", False):
        return

    def patch(tensor: Any, *scope: Any) -> None:
        # Triton 3.5 calls patch(tensor); 3.6 patch(tensor, scope) and undoes it through the scope.
        original(tensor, *scope)
        index = lambda self: int(self.handle.data.item())  # noqa: E731
        if scope:
            scope[0].set_attr(tensor, "__index__", index)
        else:
            tensor.__index__ = index

    patch._infer_ref_shim = True  # type: ignore[attr-defined]
    interpreter._patch_lang_tensor = patch


if os.environ.get("TRITON_INTERPRET") == "1":
    _install_interpreter_index_shim()
