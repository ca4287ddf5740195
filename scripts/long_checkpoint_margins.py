"""Measure what the long-context checkpoints' inits give: greedy margins, loops, and how far back the
context still moves the next token's logprobs (the figures in docs/engines.md, "Long contexts").

    python scripts/long_checkpoint_margins.py [--length 8200] [--steps 32] [--prompts 2]

Per checkpoint (written to a temporary folder, run by transformers in float32 on the CPU): the
top-2 gap of every greedy step (median, smallest, share below 0.1 nat), distinct tokens per
continuation, and the largest change of the last position's logprobs when one prompt token is
replaced: at position 0 (only a global layer reaches it), and just outside and just inside the
sliding window (where there is one).
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
from pathlib import Path

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=8200)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--only", default=None, help="one checkpoint name")
    args = parser.parse_args()
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM

    from infer_ref.conformance.engines.workloads.checkpoints import write_checkpoint
    from infer_ref.conformance.engines.workloads.long_checkpoints import LONG_CHECKPOINTS, LONG_STYLE
    from infer_ref.conformance.engines.workloads.prompts import model_facts, random_prompt

    for spec in LONG_CHECKPOINTS:
        if args.only and spec.name != args.only:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            folder = write_checkpoint(spec, Path(tmp) / spec.name, LONG_STYLE)
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
            facts = model_facts(folder)
            window = model.config.sliding_window if "gemma" in spec.name else None
            gaps, distinct = [], []
            rng = random.Random(f"margins/{spec.name}")
            lengths = [600] + [args.length] * (args.prompts - 1)
            influence = {}
            for length in lengths:
                prompt = list(random_prompt(facts, length, rng))
                with torch.inference_mode():
                    out = model.generate(torch.tensor([prompt]), max_new_tokens=args.steps, do_sample=False,
                                         output_scores=True, return_dict_in_generate=True,
                                         eos_token_id=None, pad_token_id=0)
                    tokens = out.sequences[0, length:].tolist()
                    for score in out.scores:
                        top2 = torch.topk(torch.log_softmax(score[0].double(), -1), 2).values
                        gaps.append(float(top2[0] - top2[1]))
                    distinct.append(len(set(tokens)))
                    if length == args.length:
                        base = torch.log_softmax(model(torch.tensor([prompt])).logits[0, -1].double(), -1)
                        where = {"position 0": 0}
                        if window:
                            where["just outside the window"] = length - window - 1
                            where["just inside the window"] = length - window + 1
                        for label, pos in where.items():
                            changed = list(prompt)
                            changed[pos] = prompt[pos + 1] if prompt[pos + 1] != prompt[pos] else prompt[pos + 2]
                            moved = torch.log_softmax(model(torch.tensor([changed])).logits[0, -1].double(), -1)
                            influence[label] = float((moved - base).abs().max())
            small = sum(g < 0.1 for g in gaps) / len(gaps)
            print(f"{spec.name}: greedy top-2 gap median {statistics.median(gaps):.3f}, smallest {min(gaps):.2e}, "
                  f"{small:.0%} below 0.1 ({len(gaps)} steps); distinct tokens per {args.steps}-step continuation {distinct}; "
                  + "; ".join(f"one token replaced at {k}: last logprobs move {v:.3g} nats" for k, v in influence.items()))


if __name__ == "__main__":
    main()
