"""An argument list written once: the entry points of a kernel family (the reference, the
dispatching call, the kernel's launcher, the host checks) take the same arguments, so each family
declares them once, as the fields of a frozen dataclass (``AttentionCall``, ``GemvCall``) or a
constructor of one, and every entry point is written over that one object.

:func:`takes_arguments_of` turns ``fn(call, *extras)`` into an entry point its callers call as
before, with the arguments of ``build`` (positional or by name, with their defaults), then
``fn``'s own extras (a launcher's knobs). The entry point's ``inspect.signature`` (what ``help``
shows) is that combined list; a wrong argument is refused by ``build`` itself, naming it.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

C = TypeVar("C")
R = TypeVar("R")


def takes_arguments_of(build: Callable[..., C]) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Decorate ``fn(call, *extras, **extra_knobs)``: the result takes ``build``'s arguments, builds
    the call from them and passes it to ``fn``, with what follows them (extra positionals after all
    of ``build``'s, extra keywords by any name ``build`` does not take)."""
    own = inspect.signature(build).parameters
    names = frozenset(own)
    width = sum(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in own.values())

    def decorate(fn: Callable[..., R]) -> Callable[..., R]:
        extras = list(inspect.signature(fn).parameters.values())[1:]  # after the call itself
        signature = _combined(own.values(), extras, fn)

        @functools.wraps(fn)
        def entry(*args: Any, **kwargs: Any) -> R:
            for_build = kwargs if not extras else {name: kwargs.pop(name) for name in names & kwargs.keys()}
            try:
                call = build(*args[:width], **for_build) if extras else build(*args, **for_build)
            except TypeError:  # arguments that do not fit: refused naming the entry point
                _refuse_unbindable(signature, fn.__name__, args, {**kwargs, **for_build} if extras else kwargs)
                raise
            return fn(call, *args[width:], **kwargs) if extras else fn(call)

        entry.__signature__ = signature  # type: ignore[attr-defined]
        return entry

    return decorate


def _refuse_unbindable(signature: inspect.Signature, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """A call its arguments do not fit is refused naming the entry point, as Python would name it."""
    try:
        signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise TypeError(f"{name}(): {exc}") from None


def _combined(own: Any, extras: list[inspect.Parameter], fn: Callable[..., Any]) -> inspect.Signature:
    """``build``'s parameters, then ``fn``'s extras (keyword-only ones last, as Python orders them)."""
    params = [*own, *extras]
    params.sort(key=lambda p: p.kind is inspect.Parameter.KEYWORD_ONLY)  # stable: keeps each group's order
    return inspect.Signature(params, return_annotation=inspect.signature(fn).return_annotation)


__all__ = ["takes_arguments_of"]
