"""Repro: two OpenVINO GenAI prefix-cache failures the engine tier found (docs/engines.md, "OpenVINO GenAI —
prefix caching under a full pool"). OpenVINO GenAI only (its venv), after a tier run exported the
checkpoints into ~/.cache/infer_ref/openvino.

    python scripts/repro_openvino_prefix_cache.py continued   # llama-tiny: continued conversations served warm
    python scripts/repro_openvino_prefix_cache.py ignored     # qwen3-long: a warm batch past the pool, dropped

``continued``: ten first turns answered greedily, then each continued (its prompt, its answer, nine
new tokens), the continuations in one batch on the same pipeline: printed, for each variant, the
first-turn lengths whose continuation differs from the same prompt on a pipeline without prefix
caching. ``ignored``: two long prompts (8191 and 8193 tokens) in one batch, twice, on a pool of 288
blocks of 32 (each fits alone): printed, each time, every request's status and number of outputs.
"""

import glob
import pathlib
import random
import sys

import numpy as np
import openvino
import openvino_genai as genai

F32 = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}
_ids = iter(range(1_000_000))


def pipeline(name: str, prefix: bool, kv_blocks: int, budget: int) -> genai.ContinuousBatchingPipeline:
    [folder] = glob.glob(str(pathlib.Path.home() / f".cache/infer_ref/openvino/{name}-*"))
    config = genai.SchedulerConfig()
    config.enable_prefix_caching, config.max_num_batched_tokens, config.dynamic_split_fuse = prefix, budget, True
    config.num_kv_blocks, config.max_num_seqs = kv_blocks, 256
    return genai.ContinuousBatchingPipeline(folder, config, "CPU", F32)


def run(pipe: genai.ContinuousBatchingPipeline, prompts: list[list[int]], n: int = 16) -> list:
    handles = []
    for prompt in prompts:
        config = genai.GenerationConfig()
        config.max_new_tokens, config.logprobs, config.ignore_eos = n, 1, True
        handles.append(pipe.add_request(next(_ids), openvino.Tensor(np.array([prompt], dtype=np.int64)), config))
    while pipe.has_non_finished_requests():
        pipe.step()
    return handles


def tokens(handles: list) -> list[list[int]]:
    return [list(h.read_all()[0].generated_ids) for h in handles]


def continued(kv_blocks: int, budget: int, answer: str, one_by_one: bool = False) -> list[int]:
    rng = random.Random(0)
    lengths = [5, 31, 32, 33, 63, 64, 65, 95, 96, 97]
    firsts = [[rng.randrange(10, 400) for _ in range(n)] for n in lengths]
    turns = [[rng.randrange(10, 400) for _ in range(9)] for _ in lengths]
    warm = pipeline("llama-tiny", True, kv_blocks, budget)
    answers = tokens(run(warm, firsts))
    middles = {"own": answers, "fresh": [[rng.randrange(10, 400) for _ in a] for a in answers],
               "own, last token dropped": [a[:-1] for a in answers]}[answer]
    prompts = [p + m + t for p, m, t in zip(firsts, middles, turns, strict=True)]
    served = [tokens(run(warm, [p]))[0] for p in prompts] if one_by_one else tokens(run(warm, prompts))
    cold = [tokens(run(pipeline("llama-tiny", False, 64, 8192), [p]))[0] for p in prompts]
    return [n for n, w, c in zip(lengths, served, cold, strict=True) if w != c]


def main() -> None:
    if sys.argv[1:] == ["continued"]:
        print("10 blocks, chunks of 64, the answers continued:", continued(10, 64, "own"))  # -> [31, 32, 33, 63, 97]
        print("the same, answer's last token dropped:", continued(10, 64, "own, last token dropped"))  # -> still wrong
        print("fresh tokens instead of the answers:", continued(10, 64, "fresh"))  # -> []
        print("continuations one at a time:", continued(10, 64, "own", one_by_one=True))  # -> []
        print("an ample pool (64 blocks):", continued(64, 64, "own"))  # -> []
        print("whole-prompt prefill:", continued(10, 8192, "own"))  # -> []
    elif sys.argv[1:] == ["ignored"]:
        rng = random.Random(0)
        prompts = [[rng.randrange(10, 400) for _ in range(n)] for n in (8191, 8193)]
        for prefix in (True, False):
            pipe = pipeline("qwen3-long-t4", prefix, 288, 1000)
            for attempt in ("cold", "warm"):
                handles = run(pipe, prompts)
                print(f"prefix caching {prefix}, {attempt}:", [(str(h.get_status()).rsplit('.', 1)[-1], len(h.read_all())) for h in handles])
        # -> prefix caching True, warm: [('IGNORED', 0), ('IGNORED', 0)]; every other line FINISHED, 1 output each
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
