"""Repro of the engine tier's finding on an NVIDIA H200 (docs/engines.md, "transformers on CUDA"):
transformers' ``generate`` in float32 with SDPA attention on CUDA, gemma3-tiny, the tier's
65-token boundary prompt: the next-token logprobs 2.8 nats from the float64 oracle, where eager
attention on the same GPU, SDPA on the CPU, and every other prompt length agree within 5e-5.

Each attention is run over the whole prompt (one forward, as ``generate``'s prefill does) and its
last position's log-softmax compared with the float64 oracle; SDPA is run with PyTorch's choice of
backend and then with each backend pinned, which tells whether the fault is one kernel's or the
mask transformers hands to all of them.

    python scripts/repro_sdpa_cuda_float32.py [--device cuda] [--length 65]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import AutoModelForCausalLM

from infer_ref.conformance.engines.oracle import oracle_logprobs
from infer_ref.conformance.engines.workload import BLOCK_SIZE, boundary_prompts, model_facts

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--length", type=int, default=2 * BLOCK_SIZE + 1, help="the boundary prompt's length (default 65)")
    args = parser.parse_args()
    prompt = next(p for p in boundary_prompts(model_facts(MODEL)) if len(p) == args.length)
    oracle = oracle_logprobs(MODEL, prompt)[-1]  # [V], float64 on the CPU
    runs = {"eager": ("eager", None), "sdpa": ("sdpa", None)}
    if args.device.startswith("cuda"):
        runs |= {f"sdpa pinned to {name}": ("sdpa", backend) for name, backend in BACKENDS.items()}
    report = {}
    for name, (attention, backend) in runs.items():
        try:
            report[name] = float((last_logprobs(attention, args.device, prompt, backend) - oracle).abs().max())
        except RuntimeError as e:  # a pinned backend that cannot take this input says so
            report[name] = f"not run: {str(e).splitlines()[0][:120]}"
    print(json.dumps({"device": args.device, "torch": torch.__version__, "prompt_length": len(prompt), "max_abs_logprob_diff": report}, indent=1))


if __name__ == "__main__":
    main()
