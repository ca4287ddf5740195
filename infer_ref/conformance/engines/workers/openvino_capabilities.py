"""What OpenVINO GenAI's worker serves, besides prefix caching (declared where the start enables it):
read by the worker in OpenVINO's venv (as a sibling module) and by the adapter on the kit's side (as
a package module), so the two lists cannot drift apart. No "top_logprobs" (the pipeline returns the
chosen token's logprob only), no "cached_tokens" (not reported per request). Plain data: it imports
nothing.
"""

CAPABILITIES = (
    "prompt_logprobs",
    "seed",
    "stop_strings",
    "reset_prefix_cache",
    "chunked_prefill",
    "kv_budget",
    "block_size",
    "batch",
    "top_k_top_p",
    "ignore_eos",
)
