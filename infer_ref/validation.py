"""Checks of values that decide an answer: token ids before any work, logits before a choice.

Each check raises an error naming the argument, the bad value and what is expected, and costs
one reduction (at most one host sync) so that the generation loops can afford it at every step.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import torch
from torch import Tensor

from infer_ref.errors import NonFiniteError, UsageError

_INTEGER_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


class TokenIdError(UsageError):
    """A token id that is not an integer in ``[0, vocab_size)``."""


def check_token_ids(ids: Tensor | Sequence[int], vocab_size: int, *, name: str = "input_ids") -> None:
    """Raise :class:`TokenIdError` unless every id is an integer in ``[0, vocab_size)``.

    ``ids`` is a tensor of any shape or a sequence of Python integers (``bool`` and ``float`` are
    refused, never truncated). Inside a CUDA graph capture or ``torch.compile`` the tensor check is
    skipped: it needs a host sync, and the captured step is fed ids that were checked before.
    """
    if isinstance(ids, Tensor):
        _check_id_tensor(ids, vocab_size, name)
        return
    if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence):
        raise TokenIdError(f"{name} must be a sequence of integer token ids, got {type(ids).__name__}")
    for i, value in enumerate(ids):
        check_token_id(value, name=f"{name}[{i}]", vocab_size=vocab_size)


def check_token_id(value: object, *, name: str, vocab_size: int | None = None) -> None:
    """Raise :class:`TokenIdError` unless ``value`` is an integer in ``[0, vocab_size)`` (``>= 0`` without one).

    ``bool`` and ``float`` are refused, never truncated; a Python int of any size is checked here,
    before it reaches torch or the tokenizer (whose ``OverflowError`` would name nothing).
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TokenIdError(f"{name} is {value!r} ({type(value).__name__}): token ids must be integers, never truncated floats")
    if vocab_size is None and int(value) < 0:
        raise TokenIdError(f"{name} is {int(value)}: expected a token id >= 0")
    if vocab_size is not None and not 0 <= int(value) < vocab_size:
        raise TokenIdError(f"{name} is {int(value)}: expected a token id in [0, {vocab_size}) (the vocab_size)")


def _check_id_tensor(ids: Tensor, vocab_size: int, name: str) -> None:
    if ids.dtype not in _INTEGER_DTYPES:
        raise TokenIdError(f"{name} must hold integer token ids, got dtype {ids.dtype}")
    if ids.numel() == 0 or _capturing():
        return
    bad = (ids < 0) | (ids >= vocab_size)
    if bool(bad.any()):  # the one host sync of the check
        where = tuple(int(i) for i in bad.nonzero()[0])
        value = int(ids[where])
        raise TokenIdError(
            f"{name} holds token id {value} at index {list(where)}: expected ids in [0, {vocab_size}) (the vocab_size)"
        )


def _capturing() -> bool:
    if torch.compiler.is_compiling():
        return True
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def can_decide(values: Tensor) -> Tensor:
    """A 0-d bool tensor, on the device: no NaN, no +inf and something above -inf in ``values``.

    Exactly ``isfinite(max(values))``: a max reduction propagates NaN, is +inf when any value is,
    and is -inf only when all are. One reduction, no host sync (the fast decode loop reads it back
    with its tokens).
    """
    return torch.isfinite(values.amax())


def nonfinite_summary(values: Tensor) -> str | None:
    """None when ``values`` can decide a choice (no NaN, no +inf, something above -inf), else why not."""
    if values.numel() and bool(can_decide(values)):  # the common case: one reduction
        return None
    nan = int(torch.isnan(values).sum())
    pos_inf = int(torch.isposinf(values).sum())
    if nan or pos_inf:
        return f"{nan} NaN and {pos_inf} +inf of {values.numel()} values"
    if values.numel() and not bool(torch.isfinite(values).any()):
        return f"all {values.numel()} values are -inf"
    return None


def check_logits(logits: Tensor, *, where: str) -> None:
    """Raise :class:`NonFiniteError` when ``logits`` ``[V]`` cannot decide a token (a silent token 0 otherwise).

    ``where`` names the step and position (``"step 3 (position 17)"``).
    """
    problem = nonfinite_summary(logits)
    if problem is not None:
        raise logits_error(where, problem)


def logits_error(where: str, problem: str) -> NonFiniteError:
    """The error for logits that cannot decide a token, at ``where`` (a step and position)."""
    return NonFiniteError(
        f"non-finite logits at {where}: {problem}; expected finite logits (a NaN or infinite weight, "
        "or an overflow in this dtype): no token can be chosen"
    )


def check_tokenizer_fits(tokenizer: object, model_type: str, vocab_size: int) -> None:
    """Refuse a tokenizer of another model: another family, or ids the model has no embedding for.

    Reads the tokenizer's ``model_type`` and ``vocab_size`` when it has them (a bare decoder has
    neither and is not checked). A tokenizer smaller than the vocabulary is normal (padded embeddings).
    """
    tok_type = getattr(tokenizer, "model_type", None)
    if isinstance(tok_type, str) and tok_type != model_type:
        raise UsageError(
            f"the tokenizer is a {tok_type} tokenizer but the model is {model_type}: use the tokenizer of the model's snapshot"
        )
    tok_vocab = getattr(tokenizer, "vocab_size", None)
    if isinstance(tok_vocab, int) and tok_vocab > vocab_size:
        raise UsageError(
            f"the tokenizer has {tok_vocab} ids but the model's vocab_size is {vocab_size}: "
            "use the tokenizer of the model's snapshot"
        )


def check_layer_index_type(layer_idx: object, num_layers: int) -> None:
    """Raise ``TypeError`` unless ``layer_idx`` is a Python ``int`` (or ``bool``, which the range check refuses).

    A NumPy integer or a 0-d tensor is an index of the wrong type, not an index out of range: the
    message says so and how to convert it. Its range is the caller's check (``0..num_layers-1``).
    """
    if isinstance(layer_idx, int):
        return
    kind = type(layer_idx)
    name = kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    hint = " (convert it with int())" if isinstance(layer_idx, (numbers.Integral, Tensor)) else ""
    raise TypeError(f"layer index {layer_idx!r} is a {name}: expected a Python int in 0..{num_layers - 1}{hint}")


def check_tokenizer_decodes(tokenizer: object) -> None:
    """Refuse a tokenizer that cannot turn ids into text (``None``, or an object without ``decode``)."""
    if not callable(getattr(tokenizer, "decode", None)):
        raise UsageError(
            f"tokenizer is {tokenizer!r}: generating text needs a tokenizer with decode(ids) "
            "(the model's infer_ref.tokenizer.Tokenizer, or any object with that method)"
        )
