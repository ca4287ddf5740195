"""Long-context checkpoints of the engine tier: tiny width, released geometry, real lengths.

The engine checkpoints of :mod:`~infer_ref.conformance.engines.workloads.checkpoints` stress config fields at
small sizes (windows of 40, a RoPE threshold of 64 positions). The bugs engines ship at released
sizes hide elsewhere: a window of 512 or 1024 positions, a block table of hundreds of blocks, Llama
3's RoPE scaling around its ``original_max_position_embeddings`` of 8192. These checkpoints keep the
width tiny (two query heads, one KV head of 32 dimensions: the float64 oracle reads 8,200 positions
in about 7 s on one core) and take the rest from the released configs:

- Gemma 3 1B's layout: five sliding layers to one global (``sliding_window_pattern`` 6, six
  layers), a window of 512, local RoPE base 10,000 and global 1,000,000, no scaling;
- Gemma 3 4B's: the same layout with a window of 1024 and linear RoPE scaling (factor 8) on the
  global layers;
- Llama 3.2's RoPE: ``llama3`` scaling, factor 32, bands 1 and 4, ``original_max_position_embeddings``
  8192, base 500,000 (with 32 dimensions per head every band holds frequencies);
- Qwen 3's attention (q/k norms, base 1,000,000) at the same lengths.

They are written in the t4 config style only, as the released checkpoints ship. Each init was
chosen by measurement (``python -m infer_ref.conformance.engines.workloads.long_checkpoints``, figures in
docs/engines.md, "Long contexts"): greedy steps decided by clear margins and the far context, not
only the window, moving the last position's logprobs.
"""

from __future__ import annotations

from infer_ref.conformance.checkpoints.golden_models import SyntheticInit
from infer_ref.conformance.engines.workloads.checkpoints import EngineCheckpoint, Style

LONG_STYLE: Style = "t4"

_GEMMA_LAYERS = ["sliding_attention"] * 5 + ["full_attention"]
_GEMMA_BASE = {
    "model_type": "gemma3_text",
    "architectures": ["Gemma3ForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 6,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "query_pre_attn_scalar": 32,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 32768,
    "layer_types": _GEMMA_LAYERS,
    "hidden_activation": "gelu_pytorch_tanh",
    "attention_bias": False,
    "final_logit_softcapping": None,
    "attn_logit_softcapping": None,
    "tie_word_embeddings": True,
}
_GEMMA_INIT = SyntheticInit(gain=1.0, embed_std=0.45, norm_jitter=0.3, post_norm_gain=18.0)

GEMMA3_W512 = EngineCheckpoint(
    name="gemma3-long-window512-pattern6",
    fixture="gemma3-tiny",
    stresses=(
        "Gemma 3 1B's layout: 5 sliding layers to 1 global (sliding_window_pattern 6), six layers",
        "sliding window 512: prompts of 511, 512, 513 and 1025 positions cross it once and twice",
        "prompts to 8193 positions: a block table of 257 blocks of 32",
    ),
    architecture={
        **_GEMMA_BASE,
        "sliding_window": 512,
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        },
    },
    seed=41,
    init=_GEMMA_INIT,
)

GEMMA3_W1024 = EngineCheckpoint(
    name="gemma3-long-window1024-globalrope-linear8",
    fixture="gemma3-tiny",
    stresses=(
        "Gemma 3 4B's layout: 5 sliding layers to 1 global, six layers, sliding window 1024",
        "linear RoPE scaling (factor 8) on the global layers only, at positions to 8200",
        "prompts of 1023, 1024, 1025 and 2049 positions cross the window once and twice",
    ),
    architecture={
        **_GEMMA_BASE,
        "sliding_window": 1024,
        "rope_parameters": {
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        },
    },
    seed=42,
    init=_GEMMA_INIT,
)

LLAMA3_ROPE8192 = EngineCheckpoint(
    name="llama3-long-ropescaling8192",
    fixture="llama-tiny",
    stresses=(
        "Llama 3.2's RoPE scaling: llama3, factor 32, original_max_position_embeddings 8192, base 500000",
        "with 32 dimensions a head's wavelengths fall in every band (kept < 2048, smoothed, divided > 8192)",
        "prompts of 8191 and 8193 positions: generated steps cross the original context",
    ),
    architecture={
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 3,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 131072,
        "rope_parameters": {
            "rope_type": "llama3",
            "rope_theta": 500_000.0,
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
    },
    seed=43,
    init=SyntheticInit(gain=2.0, embed_std=1.0, norm_jitter=0.1),
)

QWEN3_LONG = EngineCheckpoint(
    name="qwen3-long",
    fixture="qwen3-tiny",
    stresses=(
        "Qwen 3's attention (q/k RMS norms, RoPE base 1000000) at prompts of 8191 and 8193 positions",
        "a block table of 257 blocks of 32 (8225 blocks of 1)",
    ),
    architecture={
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 3,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 32,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 40960,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0},
        "attention_bias": False,
        "sliding_window": None,
        "use_sliding_window": False,
        "tie_word_embeddings": True,
    },
    seed=44,
    init=SyntheticInit(gain=2.0, embed_std=1.0, norm_jitter=0.1),
)

LONG_CHECKPOINTS: tuple[EngineCheckpoint, ...] = (GEMMA3_W512, GEMMA3_W1024, LLAMA3_ROPE8192, QWEN3_LONG)
"""The long-context checkpoints, each written in :data:`LONG_STYLE`."""
