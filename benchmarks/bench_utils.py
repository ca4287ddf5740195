"""Shared helpers for the benchmark scripts: models, environment, memory, bandwidth arithmetic.

Models come from three places:
- a fixture checkpoint (``llama-tiny`` etc. under fixtures/checkpoints) or any snapshot path;
- a real-shape synthetic model (``llama-3.2-1b``, ``qwen3-1.7b``, ``gemma-3-1b-it``), weights
  drawn on the target device from a seeded generator directly in the target dtype;
- ``tiny-<family>`` (``tiny-llama``, ``tiny-qwen3``, ``tiny-gemma3_text``), the synthetic tiny
  configs, for dry runs of the GPU scripts on a CPU.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import platform
import resource
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from infer_ref.config import ModelConfig
from infer_ref.conformance.checkpoints.snapshots import REAL_SHAPE_CONFIGS, TINY_CONFIGS
from infer_ref.loader import build_on_meta, checkpoint_shapes, checkpoint_views, load_model, load_weights

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures" / "checkpoints"
LOG_DIR = Path(__file__).resolve().parent / "log"
REAL_SHAPES = tuple(REAL_SHAPE_CONFIGS)
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32, "float64": torch.float64}


class NullDecoder:
    """Token decoder for benchmarks: the text is never looked at."""

    def decode(self, ids: Any, *, skip_special_tokens: bool = True) -> str:
        return ""


# -- models --------------------------------------------------------------------------------------


def hf_config_for(name: str) -> dict[str, Any] | None:
    """The HF config dict of a synthetic model name, or None for a checkpoint."""
    if name in REAL_SHAPE_CONFIGS:
        return dict(REAL_SHAPE_CONFIGS[name])
    if name.startswith("tiny-") and name.removeprefix("tiny-") in TINY_CONFIGS:
        return dict(TINY_CONFIGS[name.removeprefix("tiny-")])
    return None


def synthetic_state(hf_config: Mapping[str, Any], device: torch.device, dtype: torch.dtype, seed: int = 0) -> dict[str, Tensor]:
    """infer_ref-named random weights drawn on ``device`` in ``dtype`` (seeded, sorted-name order).

    Same scheme as ``infer_ref.conformance.checkpoints.snapshots.random_state_dict`` (linear N(0, 1/fan_in),
    embedding N(0, 1), norms 1 + 0.1 N(0, 1), Gemma norms the offset only), but without a trip
    through a CPU float32 copy: a 1.7B-parameter model is ready in about a second on a GPU.
    """
    config = ModelConfig.from_hf_dict(hf_config)
    shapes = checkpoint_shapes(build_on_meta(config))
    gen = torch.Generator(device=device).manual_seed(seed)
    gemma = config.model_type == "gemma3_text"
    state: dict[str, Tensor] = {}
    for name in sorted(shapes):
        shape = shapes[name]
        t = torch.randn(shape, generator=gen, device=device, dtype=dtype)
        if name.endswith("norm.weight"):
            t = t.mul_(0.1) if gemma else t.mul_(0.1).add_(1.0)
        elif name == "embed_tokens.weight":
            pass
        elif name.endswith(".bias"):
            t = t.mul_(0.02)
        else:
            t = t.mul_(1.0 / math.sqrt(shape[-1]))
        state[name] = t
    return state


@torch.inference_mode()
def mean_entropy(logits: Tensor) -> float:
    """Mean entropy (nats) of the softmax of each row of ``logits`` ``[T, V]``, in float64."""
    logp = torch.log_softmax(logits.double(), dim=-1)
    return float(-(logp.exp() * logp).sum(-1).mean())


@torch.no_grad()
def calibrate_logit_scale(model: nn.Module, target_entropy: float, probe_ids: Tensor) -> float:
    """Scale the final norm's effective weight so the next-token distributions of ``probe_ids``
    ``[1, T]`` (every position) have mean entropy ``target_entropy`` nats; returns the factor ``c``.

    Why: synthetic weights tie an N(0, 1) embedding to the LM head, and with random layers the last
    hidden state stays close to the current token's embedding. Its own logit is then about
    ``hidden_size`` (2048) while the rest spread about ``sqrt(hidden_size)`` (45): every softmax is
    one-hot on "repeat the token", and no two paths' log-probs can differ, whatever their
    precision. Matching a spread (a standard deviation) leaves that outlier in place; matching an
    entropy does not. The logits are linear in the final norm's weight (no soft-capping in these
    families), so multiplying that weight by ``c`` multiplies every logit by ``c`` and changes
    nothing else; Gemma stores the weight as an offset from 1: ``(1 + w) -> c (1 + w)``. The mean
    entropy of ``softmax(c * logits)`` falls monotonically in ``c`` (from ``log V`` at 0), so ``c``
    is found by bisection on the probe's logits in float64.
    """
    config = model.config  # type: ignore[attr-defined]
    vocab = config.vocab_size
    if not 0 < target_entropy < math.log(vocab):
        raise ValueError(f"target_entropy must lie in (0, log(vocab_size) = {math.log(vocab):.3f}) nats, got {target_entropy!r}")
    if config.final_logit_softcapping is not None:
        raise ValueError("logits are soft-capped: scaling the final norm would not scale them linearly")
    logits = model(probe_ids)[0].double()  # [T, V]: without a cache, every position's logits
    low, high = 0.0, 1.0
    for _ in range(64):  # grow until the entropy is below the target (softmax sharpens with c)
        if mean_entropy(high * logits) <= target_entropy:
            break
        low, high = high, 2 * high
    else:
        raise ValueError(f"no scale brings the probe's mean entropy down to {target_entropy} nats (ties in the logits?)")
    for _ in range(100):  # bisection: entropy(low) > target >= entropy(high)
        mid = (low + high) / 2
        if mean_entropy(mid * logits) > target_entropy:
            low = mid
        else:
            high = mid
    c = (low + high) / 2
    weight = model.norm.weight  # type: ignore[attr-defined]
    if config.model_type == "gemma3_text":
        weight.copy_((1.0 + weight.double()).mul_(c).sub_(1.0).to(weight.dtype))
    else:
        weight.copy_((weight.double() * c).to(weight.dtype))  # exact linearity in float64; rounded to bf16 there
    return c


def build_infer_ref(hf_config: Mapping[str, Any], state: Mapping[str, Tensor], device: torch.device) -> nn.Module:
    return load_weights(build_on_meta(ModelConfig.from_hf_dict(hf_config)), state, device=device)


def build_hf(hf_config: Mapping[str, Any], ir_model: nn.Module, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """The transformers model of ``hf_config`` holding infer_ref's weight tensors (shared, not copied)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.for_model(hf_config["model_type"], **{k: v for k, v in hf_config.items() if k != "model_type"})
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    state = checkpoint_views(ir_model)  # q/k/v and gate/up as row views of infer_ref's packed matrices
    hf_state = {(n if n.startswith("lm_head.") else f"model.{n}"): t for n, t in state.items()}
    missing, unexpected = model.load_state_dict(hf_state, strict=False, assign=True)
    missing = [m for m in missing if not (m == "lm_head.weight" and cfg.tie_word_embeddings)]
    if missing or unexpected:
        raise RuntimeError(f"transformers model does not match: missing {missing}, unexpected {unexpected}")
    if cfg.tie_word_embeddings:
        model.tie_weights()
    return model.eval()


def load_bench_model(
    name: str, device: torch.device, dtype: torch.dtype, *, seed: int = 0
) -> tuple[nn.Module, dict[str, Any], dict[str, Any]]:
    """(infer_ref model, description, HF config). EOS ids are dropped: runs go the full length."""
    hf_config = hf_config_for(name)
    if hf_config is not None:
        model = build_infer_ref(hf_config, synthetic_state(hf_config, device, dtype, seed), device)
        source = f"synthetic {name} (seeded random weights, seed {seed}, drawn on {device.type} in {dtype})"
    else:
        path = Path(name) if Path(name).exists() else FIXTURES / name
        if not path.is_dir():
            known = ", ".join([*sorted(p.name for p in FIXTURES.glob("*") if (p / "config.json").exists()), *REAL_SHAPES])
            raise SystemExit(f"unknown model {name!r}: give a snapshot path, a fixture ({known}) or tiny-<family>")
        model, _ = load_model(path, dtype=dtype, device=device)
        hf_config = json.loads((path / "config.json").read_text())
        source = f"checkpoint {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}"
    config: ModelConfig = model.config  # type: ignore[assignment]
    model.config = dataclasses.replace(config, eos_token_ids=())  # type: ignore[assignment]
    info = {"name": name, "source": source, "model_type": config.model_type, "parameters": count_parameters(model)}
    return model, info, hf_config


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # parameters() yields tied tensors once


def weight_bytes_per_token(model: nn.Module) -> int:
    """Weight bytes one decode step reads: every matrix once, the embedding table only as one row.

    ``sum(unique parameters except embed_tokens) + hidden * itemsize``; a tied table is read in
    full once, by the LM head, so it is counted once through ``lm_head.weight``.
    """
    embed = model.embed_tokens.weight
    total = sum(p.numel() * p.element_size() for p in model.parameters() if p is not embed)
    if model.lm_head.weight is embed:
        total += embed.numel() * embed.element_size()
    return total + embed.shape[1] * embed.element_size()


def kv_bytes_per_token(config: ModelConfig, context: float, itemsize: int) -> float:
    """K and V bytes attention reads at ``context`` positions: ``2 * L * Hkv * D * context * itemsize``."""
    return 2 * config.num_hidden_layers * config.num_key_value_heads * config.computed_head_dim * context * itemsize


def kv_bytes_attended(config: ModelConfig, prompt_len: int, steps: int, itemsize: int) -> float:
    """Mean K and V bytes a decode step reads over ``steps`` steps after a ``prompt_len``-token prompt.

    Step ``i`` feeds position ``prompt_len + i`` and attends ``prompt_len + i + 1`` keys, a sliding
    layer at most its window; each key costs ``2 * Hkv * D * itemsize`` bytes per layer.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    per_key = 2 * config.num_key_value_heads * config.computed_head_dim * itemsize
    windows = [config.window_for_layer(layer) for layer in range(config.num_hidden_layers)]
    keys = sum(min(prompt_len + i + 1, w or prompt_len + i + 1) for i in range(steps) for w in windows)
    return per_key * keys / steps


# -- device, memory, environment -----------------------------------------------------------------


def pick_device(name: str | None) -> torch.device:
    if name:
        return torch.device(name)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def memory_now_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device)
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def memory_peak_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine()


def environment(device: torch.device) -> dict[str, Any]:
    """Versions and hardware, for every JSON report."""
    try:
        import transformers

        tf_version = transformers.__version__
    except ImportError:  # pragma: no cover - transformers is a test dependency
        tf_version = None
    env = {
        "device": str(device),
        "device_name": device_name(device),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": tf_version,
        "python": platform.python_version(),
        "cpu_threads": torch.get_num_threads(),
        "host": platform.node(),
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
        env["sm_count"] = props.multi_processor_count
    return env


def d2d_copy_bandwidth(device: torch.device, mib: int = 1024, iters: int = 20) -> dict[str, float]:
    """Device-to-device copy of ``mib`` MiB; bandwidth counts bytes read plus bytes written."""
    n = mib * 2**20
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    sync(device)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            dst.copy_(src)
            times.append(time.perf_counter() - t0)
    best, median = min(times), sorted(times)[len(times) // 2]
    return {"bytes_copied": n, "best_GBps": 2 * n / best / 1e9, "median_GBps": 2 * n / median / 1e9}


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def median(values: list[float]) -> float:
    return percentile(values, 50)
