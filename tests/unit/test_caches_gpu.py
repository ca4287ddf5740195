"""The cache systems on CUDA: the store kernel and the length-aware decode step behind the paged
and static caches, the compiled captured fast step, and a snapshot restored under a captured CUDA graph.

Oracles: the same model on the CPU through the contiguous cache (float32, same weights), and the
torch references of the kernels. Run with ``pytest -m gpu``.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from infer_ref import load_model
from infer_ref.cache.factory import CACHE_KINDS, build_cache
from infer_ref.conformance.checkpoints.snapshots import FAMILIES, WeightInit, random_snapshot, tiny_config
from infer_ref.engine import FastDecoder
from infer_ref.fast.modules import use_fast_modules

pytestmark = pytest.mark.gpu

PROMPT = [5, 9, 17, 33, 62, 71, 100, 3, 8]
STEPS = 20  # crosses the tiny Gemma window several times
# float32 on CUDA against float32 on the CPU: different kernels and reduction orders, same math.
ATOL = RTOL = 2e-4


@pytest.fixture(scope="module", params=FAMILIES)
def models(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    random_snapshot(folder, tiny_config(request.param), seed=3, init=WeightInit(gain=2.0))
    cpu, config = load_model(folder, dtype=torch.float32, device="cpu")
    gpu, _ = load_model(folder, dtype=torch.float32, device="cuda")
    use_fast_modules(gpu)  # the runtime's choice on CUDA: the Triton store and the length-aware kernels
    cpu.config = gpu.config = dataclasses.replace(config, eos_token_ids=())
    return cpu, gpu


def _decode_logits(model, cache, device: str) -> torch.Tensor:
    """Prefill PROMPT, then teacher-force STEPS fixed tokens one at a time; logits ``[STEPS + 1, V]``."""
    ids = torch.tensor([PROMPT], device=device)
    out = [model(ids, kv_cache=cache)[0, -1]]
    for i in range(STEPS):
        out.append(model(torch.tensor([[(7 * i + 3) % 100]], device=device), kv_cache=cache)[0, -1])
    return torch.stack(out).float().cpu()


@pytest.mark.parametrize("kind", CACHE_KINDS)
@pytest.mark.parametrize("block_size", [1, 16])
@torch.inference_mode()
def test_every_cache_type_on_cuda_matches_the_cpu_contiguous_cache(models, kind: str, block_size: int) -> None:
    """On CUDA the paged caches write through the Triton store, and the paged and static caches
    decode through the length-aware kernel: each must give the CPU contiguous cache's logits."""
    if kind not in ("paged", "static-paged") and block_size != 1:
        pytest.skip("block size only matters to the paged caches")
    cpu, gpu = models
    n = len(PROMPT) + STEPS
    want = _decode_logits(cpu, build_cache("contiguous", cpu.config, n, dtype=torch.float32, device="cpu"), "cpu")
    cache = build_cache(kind, gpu.config, n, dtype=torch.float32, device="cuda", block_size=block_size, scramble_seed=5)
    got = _decode_logits(gpu, cache, "cuda")
    torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("layout", ["static", "paged"])
@torch.inference_mode()
def test_restoring_a_snapshot_into_a_captured_decoder_replays_correctly(models, layout: str) -> None:
    """Restore copies into the static buffers in place, so the CUDA graph captured over them replays
    from the restored state: continuing from a snapshot equals continuing without interruption."""
    _, gpu = models
    decoder = FastDecoder(gpu, 64, device="cuda", cache=layout, block_size=16)  # captures its step over decoder.cache
    assert decoder._graph is not None
    ids = torch.tensor([PROMPT], device="cuda")
    decoder.prefill(ids)
    snap = decoder.cache.snapshot()
    first_input = decoder.input_ids.clone().view(-1)  # the prefill's argmax, fed by the first step
    first = [decoder.step()[0, -1].clone() for _ in range(6)]
    decoder.reset()
    decoder.prefill(torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]], device="cuda"))  # other contents
    decoder.cache.restore(snap)
    decoder.set_input(first_input)
    again = [decoder.step()[0, -1].clone() for _ in range(6)]
    for a, b in zip(first, again, strict=True):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


@pytest.mark.parametrize("layout", ["static", "paged"])
@torch.inference_mode()
def test_compiled_captured_step_matches_the_cpu_contiguous_cache(models, layout: str) -> None:
    """The fast path as the benchmarks run it: torch.compile'd, captured in a CUDA graph, decode
    kernels on (the decode-step op writing the cache in place, the GEMV kernels). Teacher-forced
    logits must equal the CPU contiguous cache's; a write through wrong strides, a functionalized
    copy that never lands in the buffer, or a stale length shows up as a different row."""
    cpu, gpu = models
    n = len(PROMPT) + STEPS
    want = _decode_logits(cpu, build_cache("contiguous", cpu.config, n, dtype=torch.float32, device="cpu"), "cpu")
    decoder = FastDecoder(gpu, n + 1, device="cuda", compile=True, cache=layout, block_size=4)
    got = [decoder.prefill(torch.tensor([PROMPT], device="cuda"))[0, -1].float().cpu()]
    for i in range(STEPS):
        decoder.set_input([(7 * i + 3) % 100])
        got.append(decoder.step()[0, -1].float().cpu())
    torch.testing.assert_close(torch.stack(got), want, atol=ATOL, rtol=RTOL)
