"""CTranslate2 on the qwen3-tiny fixture, converted by its own converter: logprobs of a request alone
against transformers' float64 oracle, EOS kept as the last token, and the starts and requests it
refuses (prefix caching, a chunked-prefill budget, stop strings) refused with a reason."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from infer_ref.conformance.engines.adapters.ct2 import start_ct2
from infer_ref.conformance.engines.adapters.subprocess_bridge import BridgedEngine
from infer_ref.conformance.engines.protocol import EngineOptions, EngineRequest
from infer_ref.conformance.engines.verdicts.oracle import oracle_logprobs
from infer_ref.conformance.interface.contract import Unsupported

pytestmark = pytest.mark.ctranslate2

# Qwen 3: the family CTranslate2's converter reads whole (docs/engines.md: Llama 3's RoPE scaling and
# Gemma 3's query scale are dropped). float32 weights and activations against the float64 oracle:
# measured within 6.6e-6 on this fixture; 1e-4 is the kit's float32 margin.
MODEL_DIR = Path(__file__).resolve().parents[2] / "fixtures" / "checkpoints" / "qwen3-tiny"
OPTIONS = EngineOptions(dtype="float32", prefix_caching=False, max_model_len=256)
ORACLE_TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def engine(ct2_interpreter: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BridgedEngine]:
    handle = start_ct2(MODEL_DIR, OPTIONS, python=ct2_interpreter)
    yield handle
    handle.stop()


def test_a_request_alone_agrees_with_the_oracle_at_every_position(engine: BridgedEngine) -> None:
    prompt = tuple((5 + 7 * i) % 300 + 7 for i in range(20))
    [out] = engine.generate([EngineRequest(prompt, 6, ignore_eos=True, logprobs=3, prompt_logprobs=3)])
    assert len(out.token_ids) == 6 and out.finish_reason == "length"
    oracle = oracle_logprobs(MODEL_DIR, list(prompt) + list(out.token_ids))  # [P + T, V]: row i predicts i + 1
    positions = [(len(prompt) - 1 + s, step) for s, step in enumerate(out.logprobs)]
    positions += [(i - 1, entry) for i, entry in enumerate(out.prompt_logprobs or ()) if entry is not None]
    for row, entry in positions:
        for token, logprob in [(entry.token, entry.logprob), *entry.top]:
            assert abs(logprob - float(oracle[row, token])) <= ORACLE_TOLERANCE, f"row {row} token {token}"


def test_unsupported_starts_and_requests_are_refused(ct2_interpreter: str) -> None:
    with pytest.raises(Unsupported, match="no prefix cache across calls"):
        start_ct2(MODEL_DIR, EngineOptions(prefix_caching=True), python=ct2_interpreter)
    with pytest.raises(Unsupported, match="no chunked-prefill budget"):
        start_ct2(MODEL_DIR, EngineOptions(prefix_caching=False, max_num_batched_tokens=64), python=ct2_interpreter)


def test_stop_strings_are_refused(engine: BridgedEngine) -> None:
    with pytest.raises(Unsupported, match="no stop strings"):
        engine.generate([EngineRequest((7, 8, 9), 4, stop=("ab",))])


def test_a_venv_without_the_converter_is_named(ct2_interpreter: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from infer_ref.conformance.engines.adapters import ct2_convert
    from infer_ref.conformance.engines.adapters.subprocess_bridge import EngineNotInstalled

    missing = tmp_path / "bin" / ct2_convert.CONVERTER
    monkeypatch.setattr(ct2_convert, "converter_path", lambda python: missing)
    with pytest.raises(EngineNotInstalled, match=f"no ct2-transformers-converter beside it \\({missing}\\)"):
        start_ct2(MODEL_DIR, OPTIONS, python=ct2_interpreter, cache=tmp_path / "cache")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_dtype_this_cpu_does_not_compute_is_refused_with_the_types_it_does(ct2_interpreter: str, dtype: str) -> None:
    """Asked for a compute type the CPU lacks, CTranslate2 would compute in another: the start is
    refused, naming the types it has, rather than judged as ``dtype``."""
    import subprocess

    supported = subprocess.run([ct2_interpreter, "-c", "import ctranslate2; print(sorted(ctranslate2.get_supported_compute_types('cpu')))"],
                               capture_output=True, text=True, check=True).stdout  # fmt: skip
    if f"'{dtype}'" in supported:
        pytest.skip(f"this CPU computes {dtype} in CTranslate2 ({supported.strip()})")
    with pytest.raises(Unsupported, match=rf"computes no {dtype} on this CPU \(its compute types here: .*float32"):
        start_ct2(MODEL_DIR, EngineOptions(dtype=dtype, prefix_caching=False, max_model_len=256), python=ct2_interpreter)
