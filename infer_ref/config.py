"""ModelConfig: one dataclass for Llama 3.x, Qwen3 and Gemma 3 text decoders.

Built from a Hugging Face ``config.json`` (a dict or a snapshot folder). Both config formats are
accepted: the old one (``rope_theta`` / ``rope_scaling`` / ``rope_local_base_freq`` /
``sliding_window_pattern``) and the new one (``rope_parameters`` / ``layer_types``). Defaults for
fields a config leaves out are the ones transformers' own config classes use, so both
implementations build the same model from the same file.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from infer_ref.errors import DataError

FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"
LAYER_TYPES = (FULL_ATTENTION, SLIDING_ATTENTION)

SUPPORTED_MODEL_TYPES = ("llama", "qwen3", "gemma3_text", "gemma3")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
SUPPORTED_ACTIVATIONS = ("silu", "gelu_pytorch_tanh")

REQUIRED_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
)

# transformers' defaults for fields a config.json may omit, per family.
_FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {
        "head_dim": None,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10_000.0,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
    "qwen3": {
        "head_dim": 128,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10_000.0,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "bos_token_id": None,
        "eos_token_id": None,
    },
    "gemma3_text": {
        "head_dim": 256,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0,
        "rope_local_base_freq": 10_000.0,
        "max_position_embeddings": 131_072,
        "tie_word_embeddings": True,
        "hidden_act": "gelu_pytorch_tanh",
        "query_pre_attn_scalar": 256,
        "sliding_window": 4096,
        "sliding_window_pattern": 6,
        "bos_token_id": 2,
        "eos_token_id": 1,
    },
}


class ConfigError(DataError):
    """A config.json that infer_ref cannot build a model from (a ``ValueError``; CLI exit status 3)."""


def read_json_object(path: Path, error: type[Exception]) -> dict[str, Any]:
    """The JSON object in ``path``; ``error`` naming the file when it is unreadable, not JSON or not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise error(f"cannot read {path}: {err}") from None
    if not isinstance(data, dict):
        raise error(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding parameters for one kind of layer."""

    theta: float
    rope_type: str = "default"  # "default" | "linear" | "llama3"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int | None = None


@dataclass(frozen=True)
class ModelConfig:
    """Everything the three decoder families need, in one place."""

    model_type: str  # "llama" | "qwen3" | "gemma3_text"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope: RopeConfig  # full-attention layers
    layer_types: tuple[str, ...]
    head_dim: int | None = None
    local_rope: RopeConfig | None = None  # sliding-window layers (Gemma 3); None: same as ``rope``
    sliding_window: int | None = None
    tie_word_embeddings: bool = False
    hidden_act: str = "silu"
    query_pre_attn_scalar: float | None = None
    attention_bias: bool = False
    mlp_bias: bool = False
    final_logit_softcapping: float | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    # -- derived -------------------------------------------------------------------------------

    @property
    def computed_head_dim(self) -> int:
        return self.head_dim if self.head_dim is not None else self.hidden_size // self.num_attention_heads

    @property
    def attention_scale(self) -> float:
        """Softmax scale: ``query_pre_attn_scalar ** -0.5`` for Gemma 3, ``head_dim ** -0.5`` otherwise."""
        if self.query_pre_attn_scalar is not None:
            return float(self.query_pre_attn_scalar) ** -0.5
        return float(self.computed_head_dim) ** -0.5

    @property
    def has_qk_norm(self) -> bool:
        return self.model_type in ("qwen3", "gemma3_text")

    def is_sliding(self, layer_idx: int) -> bool:
        return self.layer_types[layer_idx] == SLIDING_ATTENTION

    def window_for_layer(self, layer_idx: int) -> int | None:
        """Sliding window of layer ``layer_idx`` (None for full attention)."""
        return self.sliding_window if self.is_sliding(layer_idx) else None

    def rope_for_layer_type(self, layer_type: str) -> RopeConfig:
        if layer_type == SLIDING_ATTENTION and self.local_rope is not None:
            return self.local_rope
        return self.rope

    def fingerprint(self) -> str:
        """sha256 of the canonical JSON of every field: identifies the architecture exactly."""
        fields = asdict(self)
        fields.pop("extra")
        blob = json.dumps(fields, sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()

    # -- construction --------------------------------------------------------------------------

    @classmethod
    def from_hf_dict(cls, raw: Mapping[str, Any]) -> ModelConfig:
        """Build from the dict of an HF ``config.json``."""
        return _parse(raw)

    @classmethod
    def from_pretrained(cls, path: str | Path) -> ModelConfig:
        """Build from a snapshot folder (or a config.json file)."""
        path = Path(path)
        config_file = path / "config.json" if path.is_dir() else path
        if not config_file.is_file():
            raise ConfigError(f"no config.json at {config_file}: expected a Hugging Face snapshot folder")
        return _parse(read_json_object(config_file, ConfigError))


# -- parsing -------------------------------------------------------------------------------------
#
# Every field is checked for its type and range and never coerced: ``2.5`` heads, ``"false"`` for a
# boolean or ``"12"`` for a token id are refused with the field's name, not read as 2, True or (1, 2).


def _parse(raw: Mapping[str, Any]) -> ModelConfig:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"config must be a mapping (the dict of a config.json), got {type(raw).__name__}")
    model_type = raw.get("model_type")
    if model_type == "gemma3":
        text_config = raw.get("text_config")
        if not isinstance(text_config, Mapping):
            raise ConfigError("gemma3 config has no 'text_config' dict: expected the nested text decoder config")
        raw = {"model_type": "gemma3_text", **text_config}
        model_type = "gemma3_text"
    if not isinstance(model_type, str) or model_type not in _FAMILY_DEFAULTS:
        raise ConfigError(
            f"unsupported model_type {model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    missing = [name for name in REQUIRED_FIELDS if raw.get(name) is None]
    if missing:
        raise ConfigError(f"{model_type} config is missing required field(s): {', '.join(missing)}")

    defaults = _FAMILY_DEFAULTS[model_type]

    def get(name: str) -> Any:
        # An explicit null stays null, as in transformers; only an absent key takes the default.
        return raw[name] if name in raw else defaults.get(name)

    vocab_size = _positive_int(raw, "vocab_size")
    hidden_size = _positive_int(raw, "hidden_size")
    num_layers = _positive_int(raw, "num_hidden_layers")
    num_heads = _positive_int(raw, "num_attention_heads")
    num_kv_heads = num_heads if raw.get("num_key_value_heads") is None else _positive_int(raw, "num_key_value_heads")
    if num_heads % num_kv_heads:
        raise ConfigError(
            f"num_attention_heads ({num_heads}) must be a positive multiple of num_key_value_heads ({num_kv_heads})"
        )
    head_dim = _optional(get("head_dim"), "head_dim", _check_positive_int)
    if head_dim is None and hidden_size % num_heads:
        raise ConfigError(
            f"hidden_size ({hidden_size}) must be a multiple of num_attention_heads ({num_heads}) when head_dim is not given"
        )
    if (head_dim or hidden_size // num_heads) % 2:
        raise ConfigError(f"head_dim ({head_dim or hidden_size // num_heads}) must be even: RoPE rotates pairs of dimensions")
    activation_key = "hidden_activation" if raw.get("hidden_activation") is not None else "hidden_act"
    hidden_act = raw.get(activation_key, defaults["hidden_act"])
    if hidden_act is None:
        hidden_act = defaults["hidden_act"]
    if not isinstance(hidden_act, str) or hidden_act not in SUPPORTED_ACTIVATIONS:
        raise ConfigError(
            f"unsupported activation {hidden_act!r} ({activation_key}); supported: {', '.join(SUPPORTED_ACTIVATIONS)}"
        )
    if raw.get("attn_logit_softcapping") is not None:
        raise ConfigError("attn_logit_softcapping is not supported (Gemma 2 feature; Gemma 3 sets it to null)")

    sliding_window, layer_types = _layer_types(raw, model_type, num_layers, defaults)
    rope, local_rope = _rope(raw, model_type, defaults)

    return ModelConfig(
        model_type=model_type,
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=_positive_int(raw, "intermediate_size"),
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=head_dim,
        rms_norm_eps=float(_check_positive_number(get("rms_norm_eps"), "rms_norm_eps")),
        max_position_embeddings=_check_positive_int(get("max_position_embeddings"), "max_position_embeddings"),
        rope=rope,
        local_rope=local_rope,
        layer_types=layer_types,
        sliding_window=sliding_window,
        tie_word_embeddings=_check_bool(get("tie_word_embeddings"), "tie_word_embeddings"),
        hidden_act=hidden_act,
        query_pre_attn_scalar=_optional(get("query_pre_attn_scalar"), "query_pre_attn_scalar", _check_positive_number),
        attention_bias=_check_bool(raw.get("attention_bias", False), "attention_bias"),
        mlp_bias=_check_bool(raw.get("mlp_bias", False), "mlp_bias"),
        final_logit_softcapping=_optional(
            raw.get("final_logit_softcapping"), "final_logit_softcapping", _check_positive_number
        ),
        bos_token_id=_optional(get("bos_token_id"), "bos_token_id", lambda v, n: _check_token_id(v, n, vocab_size)),
        eos_token_ids=_id_tuple(get("eos_token_id"), "eos_token_id", vocab_size),
        pad_token_id=_optional(raw.get("pad_token_id"), "pad_token_id", lambda v, n: _check_token_id(v, n, vocab_size)),
        extra=dict(raw),
    )


def _positive_int(raw: Mapping[str, Any], name: str) -> int:
    return _check_positive_int(raw[name], name)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_positive_int(value: Any, name: str) -> int:
    if not _is_int(value) or value <= 0:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _check_positive_number(value: Any, name: str) -> float:
    """A finite number > 0, returned as given (an int stays an int: the fingerprint sees the file's value)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name} must be a finite number > 0, got {value!r}")
    return value


def _check_bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be true or false, got {value!r} ({type(value).__name__})")
    return value


def _check_token_id(value: Any, name: str, vocab_size: int) -> int:
    """A non-negative integer. Ids at or above ``vocab_size`` are allowed here: an EOS id the model
    can never produce changes nothing (test configs use one to switch EOS off), and an id that is
    fed to the model is checked against the vocabulary where it is used."""
    if not _is_int(value) or value < 0:
        raise ConfigError(f"{name} must be a token id (an integer >= 0; the vocab_size is {vocab_size}), got {value!r}")
    return int(value)


def _optional(value: Any, name: str, check: Callable[[Any, str], Any]) -> Any:
    return None if value is None else check(value, name)


def _id_tuple(value: Any, name: str, vocab_size: int) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, list):
        return tuple(_check_token_id(v, f"{name}[{i}]", vocab_size) for i, v in enumerate(value))
    return (_check_token_id(value, name, vocab_size),)


def _layer_types(
    raw: Mapping[str, Any], model_type: str, num_layers: int, defaults: Mapping[str, Any]
) -> tuple[int | None, tuple[str, ...]]:
    """Per-layer attention kind and the sliding window (None when no layer slides)."""
    window = raw.get("sliding_window", defaults.get("sliding_window"))
    if model_type == "qwen3" and not _check_bool(raw.get("use_sliding_window", False), "use_sliding_window"):
        window = None  # Qwen3 only slides when use_sliding_window is set
    if model_type == "llama":
        window = None

    explicit = raw.get("layer_types")
    if explicit is not None:
        if not isinstance(explicit, list):
            raise ConfigError(f"layer_types must be a list of {', '.join(LAYER_TYPES)}, got {explicit!r}")
        types = tuple(explicit)
        if len(types) != num_layers:
            raise ConfigError(f"layer_types has {len(types)} entries but num_hidden_layers is {num_layers}")
        unknown = sorted({t for t in types if t not in LAYER_TYPES}, key=repr)
        if unknown:
            raise ConfigError(f"layer_types: unknown layer type(s) {unknown}; supported: {', '.join(LAYER_TYPES)}")
    elif model_type == "gemma3_text":
        pattern_value = raw.get("sliding_window_pattern")
        pattern = _check_positive_int(
            defaults["sliding_window_pattern"] if pattern_value is None else pattern_value, "sliding_window_pattern"
        )
        types = tuple(SLIDING_ATTENTION if (i + 1) % pattern else FULL_ATTENTION for i in range(num_layers))
    elif model_type == "qwen3" and window is not None:
        first_sliding = raw.get("max_window_layers", 28)
        if not _is_int(first_sliding) or first_sliding < 0:
            raise ConfigError(f"max_window_layers must be an integer >= 0, got {first_sliding!r}")
        types = tuple(SLIDING_ATTENTION if i >= first_sliding else FULL_ATTENTION for i in range(num_layers))
    else:
        types = (FULL_ATTENTION,) * num_layers

    if SLIDING_ATTENTION in types:
        if not _is_int(window) or window <= 0:
            raise ConfigError(f"sliding layers need a positive sliding_window (an integer), got {window!r}")
        return int(window), types
    return None, types


def _rope(
    raw: Mapping[str, Any], model_type: str, defaults: Mapping[str, Any]
) -> tuple[RopeConfig, RopeConfig | None]:
    params = raw.get("rope_parameters")
    scaling = raw.get("rope_scaling")
    for name, value in (("rope_parameters", params), ("rope_scaling", scaling)):
        if value is not None and not isinstance(value, Mapping):
            raise ConfigError(f"{name} must be an object or null, got {value!r}")
    if model_type == "gemma3_text":
        if isinstance(params, Mapping) and FULL_ATTENTION in params:
            full = _rope_dict(params.get(FULL_ATTENTION), f"rope_parameters.{FULL_ATTENTION}")
            local = _rope_dict(params.get(SLIDING_ATTENTION), f"rope_parameters.{SLIDING_ATTENTION}")
        else:  # old format: rope_theta + rope_scaling for global layers, rope_local_base_freq for local
            full = dict(scaling or {})
            full.setdefault("rope_theta", raw.get("rope_theta", defaults["rope_theta"]))
            local = {"rope_theta": raw.get("rope_local_base_freq", defaults["rope_local_base_freq"])}
        full.setdefault("rope_theta", defaults["rope_theta"])
        local.setdefault("rope_theta", defaults["rope_local_base_freq"])
        return _rope_config(full, "rope_parameters.full_attention"), _rope_config(
            local, "rope_parameters.sliding_attention"
        )
    merged = dict(params) if isinstance(params, Mapping) else dict(scaling or {})
    merged.setdefault("rope_theta", raw.get("rope_theta", defaults["rope_theta"]))
    return _rope_config(merged, "rope_parameters"), None


def _rope_dict(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where} must be an object, got {value!r}")
    return dict(value)


def _rope_config(params: Mapping[str, Any], where: str) -> RopeConfig:
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ConfigError(
            f"{where}: unsupported rope_type {rope_type!r}; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
        )
    theta = float(_check_positive_number(params["rope_theta"], f"{where}.rope_theta"))
    if rope_type == "default":
        return RopeConfig(theta=theta)
    if "factor" not in params:
        raise ConfigError(f"{where}: rope_type {rope_type!r} needs 'factor'")
    factor = float(_check_positive_number(params["factor"], f"{where}.factor"))
    if rope_type == "linear":
        return RopeConfig(theta=theta, rope_type="linear", factor=factor)
    needed = ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    missing = [k for k in needed if k not in params]
    if missing:
        raise ConfigError(f"{where}: llama3 rope scaling is missing {', '.join(missing)}")
    low = float(_check_positive_number(params["low_freq_factor"], f"{where}.low_freq_factor"))
    high = float(_check_positive_number(params["high_freq_factor"], f"{where}.high_freq_factor"))
    if high <= low:
        raise ConfigError(f"{where}: high_freq_factor ({high}) must be greater than low_freq_factor ({low})")
    return RopeConfig(
        theta=theta,
        rope_type="llama3",
        factor=factor,
        low_freq_factor=low,
        high_freq_factor=high,
        original_max_position_embeddings=_check_positive_int(
            params["original_max_position_embeddings"], f"{where}.original_max_position_embeddings"
        ),
    )
