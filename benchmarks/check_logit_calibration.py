"""Why decode_compare calibrates synthetic logits, on the CPU: a real-shape synthetic model before and after.

Builds a synthetic model of a real shape (float32, CPU), reports the raw next-token distributions of
a probe prompt (mean entropy, logit spread, the current token's own logit, how often the argmax
repeats the input), calibrates to ``--entropy`` nats (``bench_utils.calibrate_logit_scale``), then
on another prompt: the mean entropy, and the KL from the float32 model to its bfloat16 copy, which
is what decode_compare's accuracy columns compare between paths.

``PYTHONPATH=. python benchmarks/check_logit_calibration.py --model llama-3.2-1b`` (about 2 minutes
and 10 GB of memory on 2 cores).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_utils import build_infer_ref, calibrate_logit_scale, mean_entropy, synthetic_state
from infer_ref.conformance.checkpoints.snapshots import REAL_SHAPE_CONFIGS


@torch.inference_mode()
def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="llama-3.2-1b", choices=sorted(REAL_SHAPE_CONFIGS))
    ap.add_argument("--entropy", type=float, default=2.0)
    args = ap.parse_args(argv)
    torch.set_num_threads(2)
    hf = REAL_SHAPE_CONFIGS[args.model]
    model = build_infer_ref(hf, synthetic_state(hf, torch.device("cpu"), torch.float32, seed=0), torch.device("cpu"))
    probe = torch.randint(4, hf["vocab_size"], (1, 32), generator=torch.Generator().manual_seed(1))
    raw = model(probe)[0]  # [T, V]
    repeats = float((raw.argmax(-1) == probe[0]).float().mean())
    print(f"raw: mean entropy {mean_entropy(raw):.3g} nats, logit std {float(raw[-1].std()):.1f}, the current "
          f"token's own logit {float(raw[-1, probe[0, -1]]):.1f}, argmax = the input token at {repeats:.0%} of positions")
    c = calibrate_logit_scale(model, args.entropy, probe)
    other = torch.randint(4, hf["vocab_size"], (1, 16), generator=torch.Generator().manual_seed(2))
    logits32 = model(other)[0].double()
    logits16 = model.to(torch.bfloat16)(other)[0].double()
    lp32, lp16 = torch.log_softmax(logits32, -1), torch.log_softmax(logits16, -1)
    kl = (lp32.exp() * (lp32 - lp16)).sum(-1)
    print(f"calibrated (c = {c:.4g}): another prompt's mean entropy {mean_entropy(logits32):.2f} nats; "
          f"KL(float32 || bfloat16) mean {float(kl.mean()):.3g}, max {float(kl.max()):.3g}")


if __name__ == "__main__":
    main()
