"""Repro: CTranslate2 4.8.5 computes a Gemma 3 prompt longer than its sliding window wrong (docs/engines.md,
"Long contexts"): alone, one generated step, against transformers in float64.

    python scripts/repro_ct2_gemma_window.py gemma3-long-window512-pattern6-t4 500,511,512,513,538,600

Needs ctranslate2 and transformers (CTranslate2's venv), after a tier run has written the checkpoint
(~/.cache/infer_ref/engine-checkpoints) and converted it (~/.cache/infer_ref/ct2). The checkpoint has
Gemma 3 1B's layout (five sliding layers to one global, window 512, query_pre_attn_scalar = head_dim,
no RoPE scaling): nothing the converter is known to drop. Prints, per prompt length, the largest
logprob difference at the first generated step.
"""

import glob
import json
import pathlib
import random
import sys

import ctranslate2
import numpy as np
import torch
from transformers import AutoModelForCausalLM

name = sys.argv[1]
[converted] = glob.glob(str(pathlib.Path.home() / f".cache/infer_ref/ct2/{name}-*-float32"))
folder = pathlib.Path.home() / ".cache/infer_ref/engine-checkpoints" / name
vocabulary = json.loads((pathlib.Path(converted) / "vocabulary.json").read_text())
generator = ctranslate2.Generator(converted, device="cpu", compute_type="float32", intra_threads=1)
model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float64, attn_implementation="sdpa")
rng = random.Random(0)
for n in [int(x) for x in sys.argv[2].split(",")]:
    prompt = [rng.randrange(10, 390) for _ in range(n)]
    [r] = generator.generate_batch([[vocabulary[t] for t in prompt]], max_length=1, sampling_topk=1, include_prompt_in_result=False,
                                   return_logits_vocab=True, end_token=[])
    engine = torch.log_softmax(torch.tensor(np.array(r.logits[0][0]), dtype=torch.float64), -1)
    with torch.no_grad():
        oracle = torch.log_softmax(model(torch.tensor([prompt])).logits[0, -1].double(), -1)
    print(f"{name}: prompt of {n} tokens alone: first generated step, largest |CTranslate2 - transformers| {float((engine - oracle).abs().max()):.3g} nats")
