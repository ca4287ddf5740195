"""An engine that declines a kind of start (Unsupported) makes the tests needing it "not supported",
once: the tier does not start it again, and a real start failure still fails."""

from __future__ import annotations

from pathlib import Path

import pytest

from infer_ref.conformance.engines.protocol import EngineHandle, EngineOptions
from infer_ref.conformance.engines.session import EngineStartError, EngineTier
from infer_ref.conformance.interface.contract import Unsupported

STARTS: list[bool] = []


def refuse_plain(model_dir: Path, options: EngineOptions) -> EngineHandle:
    STARTS.append(options.prefix_caching)
    if not options.prefix_caching:
        raise Unsupported("this server always reuses the previous request's prefix")
    raise RuntimeError("the stressed start crashed")


def test_a_declined_start_is_unsupported_once_and_a_crash_still_fails(tmp_path: Path) -> None:
    STARTS.clear()
    tier = EngineTier(engine=f"{__name__}:refuse_plain", endpoint=None, dtype="float32")
    for _ in range(2):
        with pytest.raises(Unsupported, match=r"\(plain start\): Unsupported: this server always reuses"):
            tier.handle(tmp_path, "plain")
    with pytest.raises(EngineStartError, match="could not start .* RuntimeError: the stressed start crashed"):
        tier.handle(tmp_path, "stressed")
    assert STARTS == [False, True]
