"""Generation speed (pytest-benchmark; marked ``benchmark``, out of the default tier).

The KV-cache gate measures cached and uncached generation back to back in one run, on a workload
where the uncached cost really grows (long prompt and generation for the device), and asserts a
speedup of at least 2x; the ratio goes into the benchmark's ``extra_info``. Workloads:

- CPU: the fixture checkpoint ``llama-tiny`` (a synthetic tiny Llama when it is absent), float32,
  prompt 256, 192 new tokens;
- CUDA: the real-shape synthetic Llama-3.2-1B, bfloat16, prompt 4096, 64 new tokens.

Override with INFER_REF_BENCH_MODEL / _PROMPT / _NEW / _DTYPE. Run: ``pytest -m benchmark
tests/benchmarks --benchmark-autosave`` (see benchmarks/README.md for comparing runs).
"""

from __future__ import annotations

import os
import time

import pytest
import torch

from benchmarks.bench_utils import DTYPES, FIXTURES, NullDecoder, load_bench_model, median, sync
from infer_ref.engine import FastDecoder
from infer_ref.engine.generate import generate
from infer_ref.sampling import SamplingParams

pytestmark = pytest.mark.benchmark


def _workload(device: str) -> dict:
    cuda = device.startswith("cuda")
    default_model = "llama-3.2-1b" if cuda else ("llama-tiny" if (FIXTURES / "llama-tiny" / "config.json").exists() else "tiny-llama")
    return {
        "model": os.environ.get("INFER_REF_BENCH_MODEL", default_model),
        "prompt": int(os.environ.get("INFER_REF_BENCH_PROMPT", 4096 if cuda else 256)),
        "new": int(os.environ.get("INFER_REF_BENCH_NEW", 64 if cuda else 192)),
        "dtype": os.environ.get("INFER_REF_BENCH_DTYPE", "bfloat16" if cuda else "float32"),
        "device": device,
    }


@pytest.fixture(scope="module")
def setup(device):
    work = _workload(device)
    dev = torch.device(device)
    model, _info, _ = load_bench_model(work["model"], dev, DTYPES[work["dtype"]])
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(4, model.config.vocab_size, (work["prompt"],), generator=gen).tolist()
    return model, prompt, work, dev


def _generate(model, prompt, new, device, **kw):
    result = generate(model, NullDecoder(), prompt, SamplingParams(temperature=0, max_new_tokens=new), device=device, **kw)
    sync(device)
    return result


def test_kv_cache_speedup_gate(benchmark, setup) -> None:
    model, prompt, work, device = setup
    _generate(model, prompt, 2, device, use_kv_cache=False)  # warm the uncached kernels
    cached = benchmark.pedantic(
        _generate, args=(model, prompt, work["new"], device), kwargs={"use_kv_cache": True}, rounds=3, warmup_rounds=1
    )
    uncached_times = []
    for _ in range(2 if device.type == "cpu" else 1):
        t0 = time.perf_counter()
        uncached = _generate(model, prompt, work["new"], device, use_kv_cache=False)
        uncached_times.append(time.perf_counter() - t0)
    cached_s = benchmark.stats.stats.median
    ratio = median(uncached_times) / cached_s
    benchmark.extra_info.update(
        workload=work, cached_s=cached_s, uncached_s=median(uncached_times), speedup=ratio,
        tokens_equal=cached.token_ids == uncached.token_ids,
    )
    print(f"\nKV cache speedup on {work}: {ratio:.2f}x (cached {cached_s:.3f}s, uncached {median(uncached_times):.3f}s)")
    assert ratio >= 2.0, f"KV cache speedup {ratio:.2f}x < 2x on {work}"


def test_fast_decode_speed(benchmark, setup) -> None:
    """Decode with the fast path; records its decode tokens/s and the ratio to eager in one run."""
    model, prompt, work, device = setup
    new = min(work["new"] * 2, 256)
    decoder = FastDecoder(model, len(prompt) + new, device=device)
    fast = benchmark.pedantic(
        _generate, args=(model, prompt, new, device), kwargs={"decode": decoder}, rounds=3, warmup_rounds=1
    )
    eager = [_generate(model, prompt, new, device) for _ in range(2)][-1]
    fast_tps = (new - 1) / fast.timing.decode_time_s
    eager_tps = (new - 1) / eager.timing.decode_time_s
    benchmark.extra_info.update(
        workload=dict(work, new=new), fast_decode_tokens_per_s=fast_tps, eager_decode_tokens_per_s=eager_tps,
        fast_vs_eager=fast_tps / eager_tps,
    )
    print(f"\nfast decode {fast_tps:.1f} tok/s, eager {eager_tps:.1f} tok/s ({fast_tps / eager_tps:.2f}x)")
