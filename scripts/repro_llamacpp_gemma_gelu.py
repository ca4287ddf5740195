"""Repro: llama.cpp on the long-context Gemma 3 checkpoints (released layout) is 1e-3 to 6e-3 nats off
the float64 oracle, and a float16 GELU table explains most of it (docs/engines.md, "Long contexts").

    python scripts/repro_llamacpp_gemma_gelu.py gemma3-long-window512-pattern6-t4 513

Needs llama-cpp-python and transformers (llama.cpp's venv), after a tier run has written the
checkpoint (~/.cache/infer_ref/engine-checkpoints) and converted it (~/.cache/infer_ref/gguf).
Prints the largest logprob difference over the last 8 positions between llama.cpp (float32 GGUF,
float32 K/V, the whole prompt in one batch) and transformers in float64, as written and with its
GELU replaced by what ggml's CPU GELU computes (GGML_GELU_FP16: the input rounded to float16, the
result read from a float16 table).
"""

import glob
import pathlib
import random
import sys

import llama_cpp
import numpy as np
import torch
from transformers import AutoModelForCausalLM

name, n = sys.argv[1], int(sys.argv[2])
folder = pathlib.Path.home() / ".cache/infer_ref/engine-checkpoints" / name
[gguf] = glob.glob(str(pathlib.Path.home() / f".cache/infer_ref/gguf/{name}-*-f32.gguf"))
rng = random.Random(0)
tokens = [rng.randrange(10, 390) for _ in range(n)]
llm = llama_cpp.Llama(model_path=gguf, logits_all=True, n_ctx=n + 8, n_batch=n + 8, n_ubatch=n + 8, type_k=0, type_v=0, verbose=False)
llm.eval(tokens)
engine = torch.log_softmax(torch.tensor(np.array(llm.scores[:n]), dtype=torch.float64), -1)[-8:]


class Float16GeluTable(torch.nn.Module):
    def forward(self, x):
        rounded = x.to(torch.float16).to(torch.float32)
        return torch.nn.functional.gelu(rounded, approximate="tanh").to(torch.float16).to(x.dtype)


def transformers_logprobs(f16_gelu):
    model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float64, attn_implementation="sdpa")
    if f16_gelu:  # ggml's CPU GELU: the input rounded to float16, the result read from a float16 table
        for layer in model.model.layers:
            layer.mlp.act_fn = Float16GeluTable()
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([tokens])).logits[0].double(), -1)[-8:]


exact, emulated = transformers_logprobs(False), transformers_logprobs(True)
print(f"{name} at {n} positions, last 8 rows: llama.cpp - transformers {float((engine - exact).abs().max()):.2e}; "
      f"llama.cpp - transformers with a float16 GELU table {float((engine - emulated).abs().max()):.2e}")
