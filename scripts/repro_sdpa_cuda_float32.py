"""Repro of the engine tier's finding on an NVIDIA H200 (docs/engines.md, "transformers on CUDA"):
transformers' ``generate`` in float32 with SDPA attention on CUDA, gemma3-tiny, the tier's
65-token boundary prompt: the next-token logprobs 2.8 nats from the float64 oracle, where eager
attention on the same GPU, SDPA on the CPU, and every other prompt length agree within 5e-5.

Each attention is run over the whole prompt (one forward, as ``generate``'s prefill does) and its
last position's log-softmax compared with the float64 oracle; SDPA is run with PyTorch's choice of
backend and then with each backend pinned, which tells whether the fault is one kernel's or the
mask transformers hands to all of them.

    python scripts/repro_sdpa_cuda_float32.py [--device cuda] [--length 65 [64 ...]]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import AutoModelForCausalLM

from infer_ref.conformance.engines.verdicts.oracle import oracle_logprobs
from infer_ref.conformance.engines.workloads.prompts import BLOCK_SIZE, boundary_prompts, model_facts

MODEL = Path(__file__).resolve().parents[1] / "fixtures" / "checkpoints" / "gemma3-tiny"
BACKENDS = {"math": SDPBackend.MATH, "efficient": SDPBackend.EFFICIENT_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}


def last_logprobs(attention: str, device: str, prompt: tuple[int, ...], backend: SDPBackend | None = None) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32, attn_implementation=attention).to(device).eval()
    ids = torch.tensor([prompt], device=device)
    with torch.inference_mode():
        if backend is None:
            logits = model(ids).logits[0, -1]
        else:
            with sdpa_kernel([backend]):
                logits = model(ids).logits[0, -1]
    return torch.log_softmax(logits.double().cpu(), dim=-1)  # [V]


def attention_kernels(device: str, prompt: tuple[int, ...]) -> list[str]:
    """The device kernels that SDPA's own choice of backend launches for ``prompt`` (profiled):
    which backend ran, named by its kernels (softmax, gemm, fmha ...)."""
    from torch.profiler import ProfilerActivity, profile

    model = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32, attn_implementation="sdpa").to(device).eval()
    ids = torch.tensor([prompt], device=device)
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CUDA]) as prof:
        model(ids)
        torch.cuda.synchronize()
    return sorted({e.key for e in prof.key_averages() if e.device_type.name == "CUDA"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--length", type=int, nargs="+", default=[2 * BLOCK_SIZE + 1],
                        help="the boundary prompts' lengths (default 65; the tier's are 5, 31-33, 63-65, 95-97)")  # fmt: skip
    parser.add_argument("--repeat", type=int, default=1, help="run SDPA with its own backend choice this many times per length")
    parser.add_argument("--kernels", action="store_true", help="also list the CUDA kernels SDPA's own choice launches")
    args = parser.parse_args()
    runs = {"eager": ("eager", None), "sdpa": ("sdpa", None)}
    if args.device.startswith("cuda"):
        runs |= {f"sdpa pinned to {name}": ("sdpa", backend) for name, backend in BACKENDS.items()}
    prompts = {len(p): p for p in boundary_prompts(model_facts(MODEL))}
    by_length: dict[int, dict[str, float | str]] = {}
    for length in args.length:
        if length not in prompts:
            raise SystemExit(f"no boundary prompt of {length} tokens (there are: {sorted(prompts)})")
        oracle = oracle_logprobs(MODEL, prompts[length])[-1]  # [V], float64 on the CPU
        report: dict[str, float | str] = {}
        for name, (attention, backend) in runs.items():
            try:
                report[name] = float((last_logprobs(attention, args.device, prompts[length], backend) - oracle).abs().max())
            except RuntimeError as e:  # a pinned backend that cannot take this input says so
                report[name] = f"not run: {str(e).splitlines()[0][:120]}"
        for attempt in range(2, args.repeat + 1):  # a result that changes from run to run reads memory it should not
            report[f"sdpa, run {attempt}"] = float((last_logprobs("sdpa", args.device, prompts[length]) - oracle).abs().max())
        if args.kernels and args.device.startswith("cuda"):
            report["sdpa kernels"] = ", ".join(attention_kernels(args.device, prompts[length]))
        by_length[length] = report
    print(json.dumps({"device": args.device, "torch": torch.__version__, "max_abs_logprob_diff_by_prompt_length": by_length}, indent=1))


if __name__ == "__main__":
    main()
