"""What the long-context workload's oracle costs: every float64 forward the tier asks of transformers,
timed on one core, per checkpoint (the figures in docs/engines.md, "Long contexts").

    python scripts/long_context_cost.py

The agreement tests teacher-force each long prompt with 16 generated tokens, and each continued
conversation (prompt, answer, new turn, 16 more): those sequences are timed here, with stand-in
answers of the same lengths (the cost does not depend on the tokens). Peak memory is the process's.
"""

from __future__ import annotations

import random
import resource
import time

import torch


def _filler(rng: random.Random, n: int) -> tuple[int, ...]:
    """``n`` stand-in token ids (the oracle's cost does not depend on which)."""
    return tuple(rng.randrange(10, 300) for _ in range(n))


def main() -> None:
    torch.set_num_threads(1)
    from infer_ref.conformance.engines.verdicts.oracle import oracle_logprobs, oracle_model
    from infer_ref.conformance.engines.workloads.folders import default_model_dirs
    from infer_ref.conformance.engines.workloads.long import (
        LONG_GENERATED,
        LONG_NEW_TURN,
        first_long_turns,
        long_requests,
    )
    from infer_ref.conformance.engines.workloads.prompts import model_facts

    total = 0.0
    for folder in default_model_dirs(long_context=True):
        facts = model_facts(folder)
        rng = random.Random(0)
        sequences = [r.prompt + _filler(rng, LONG_GENERATED) for r in long_requests(facts, folder, ignore_eos=True)]
        sequences += [r.prompt + _filler(rng, 2 * LONG_GENERATED + LONG_NEW_TURN)
                      for r in first_long_turns(facts, folder, ignore_eos=True)]  # fmt: skip
        oracle_model(folder)  # loading is not the forward's cost
        start = time.perf_counter()
        for tokens in sequences:
            oracle_logprobs(folder, tokens)
        seconds = time.perf_counter() - start
        total += seconds
        print(f"{folder.name}: {len(sequences)} oracle forwards of {min(map(len, sequences))}..{max(map(len, sequences))} "
              f"positions in {seconds:.1f} s")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"all checkpoints: {total:.1f} s of float64 forwards on one core; peak memory {peak:.1f} GiB")


if __name__ == "__main__":
    main()
