"""Hypothesis profiles of the conformance suite.

``ci`` extends Hypothesis' built-in ``ci`` profile (derandomized, no deadline, database off), so a
failure in CI is reproduced by re-running the same test id; ``dev`` is a quick local loop;
``nightly`` searches twenty times harder (random, not derandomized); ``mutants`` is ``ci`` without
the shrink phase, used by ``python -m infer_ref.conformance.mutants`` (same examples, faster verdict).

Select with ``--hypothesis-profile=NAME`` or ``INFER_REF_HYPOTHESIS_PROFILE=NAME``; with neither,
``CI=true`` selects ``ci`` and anything else ``dev``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch
from hypothesis import HealthCheck, Phase, settings

PROFILE_ENV_VAR = "INFER_REF_HYPOTHESIS_PROFILE"
# filter_too_much: draws an adapter refuses as Unsupported are rejected examples, and an
# implementation may refuse most of a strategy's range (every chunk longer than its window).
_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]


def register_profiles() -> None:
    """Register ``ci``, ``dev``, ``nightly`` and ``mutants`` (idempotent)."""
    ci = settings(settings.get_profile("ci"), max_examples=25, deadline=None, suppress_health_check=_SLOW_OK)
    settings.register_profile("ci", ci)
    settings.register_profile("dev", max_examples=10, deadline=None, suppress_health_check=_SLOW_OK)
    settings.register_profile("nightly", max_examples=500, deadline=None, suppress_health_check=_SLOW_OK)
    settings.register_profile(
        "mutants", ci, phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target]
    )


def default_profile_name() -> str:
    return os.environ.get(PROFILE_ENV_VAR) or ("ci" if os.environ.get("CI") else "dev")


def load_default_profile() -> str:
    """Register the profiles and load the one the environment asks for; returns its name."""
    register_profiles()
    name = default_profile_name()
    settings.load_profile(name)
    return name


def one_torch_thread() -> Iterator[None]:
    """A fixture body: torch on one intra-op thread while it runs, restored after.

    The kit's models are tiny (hidden 32-64): with several threads each matmul spends more time in
    thread hand-off than in arithmetic, and ``pytest -n auto`` already runs one process per core.
    """
    with one_thread():
        yield


# Holders of one_thread() now, and the thread count before the first of them. Counted, not saved per
# block: pytest tears fixtures of different scopes down in an order that is not always the reverse of
# their set-up (seen with pytest 8.0: a module fixture of a conftest finalized before the test
# module's own), and a per-block save would then restore the count another block set.
_ONE_THREAD_HOLDERS = 0
_THREADS_BEFORE_ONE = 0


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch on one intra-op thread while any such block is open; when the last one closes (in
    whatever order they close), the thread count before the first is restored."""
    global _ONE_THREAD_HOLDERS, _THREADS_BEFORE_ONE
    if _ONE_THREAD_HOLDERS == 0:
        _THREADS_BEFORE_ONE = torch.get_num_threads()
        torch.set_num_threads(1)
    _ONE_THREAD_HOLDERS += 1
    try:
        yield
    finally:
        _ONE_THREAD_HOLDERS -= 1
        if _ONE_THREAD_HOLDERS == 0:
            torch.set_num_threads(_THREADS_BEFORE_ONE)

