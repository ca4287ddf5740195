"""Which attention path infer_ref's Engine takes on a device, counted, for the GPU results: on CUDA a
batched decode step reads K/V through the block tables in the fast path's paged decode kernel
(``infer_ref/fast/attention.py``), and every other step writes through its Triton store. Off CUDA
both counts are 0 (the reference attention), which is what makes the CUDA columns of the engine
matrix the fast path's verdict and not the reference's.

    python scripts/fast_path_in_engine.py [--device cuda] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import infer_ref.fast.attention as fast_attention
from infer_ref.engine.engine import Engine
from infer_ref.loader import load_model
from infer_ref.sampling import SamplingParams

MODEL = Path(__file__).resolve().parents[1] / "fixtures" / "checkpoints" / "gemma3-tiny"
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def counted(name: str, calls: dict[str, int]) -> None:
    """Wrap ``fast_attention.<name>`` so that each call is counted in ``calls[name]``."""
    original = getattr(fast_attention, name)

    def wrapper(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls[name] += 1
        return original(*args, **kwargs)

    setattr(fast_attention, name, wrapper)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=DTYPES, default="bfloat16")
    args = parser.parse_args()
    calls = {"paged_decode_attention": 0, "store_kvcache": 0}
    for name in calls:
        counted(name, calls)
    model, _ = load_model(MODEL, dtype=DTYPES[args.dtype], device=args.device)
    engine = Engine(model, num_blocks=16, block_size=16, max_batch=3)
    prompts = [[2, *range(10, 10 + n)] for n in (5, 21, 40)]
    engine.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=8))
    layers = model.config.num_hidden_layers
    print(json.dumps({"device": args.device, "dtype": args.dtype, "decode_steps": engine.stats.decode_steps,
                      "layers": layers, "calls": calls}))  # fmt: skip


if __name__ == "__main__":
    main()
