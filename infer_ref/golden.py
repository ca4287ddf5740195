"""Golden token files: format, writing (from transformers) and teacher-forced verification.

A golden file freezes what transformers, the independent oracle, generates for a model: per
prompt, the greedy tokens and at every step the top-k token ids with their logprobs. It carries
the metadata needed to tell a bug from drift (model config fingerprint, weights digest, dtype,
device, versions, generator, prompt, sampling parameters), so that

* a file that does not describe the run (other weights, other config, other dtype or device
  type) fails with :class:`GoldenMetadataMismatch`, naming the fields, *before* anything is
  compared;
* a real disagreement fails with :class:`GoldenMismatch`: the step, the tokens, both top-k lists
  and the margin.

Verification is **teacher-forced** through the implementation's own KV cache: the prompt is fed
once, then at every step the *golden* token (never our own choice), so one early difference does
not derail every later step. A step passes when

1. the golden token's logprob is within ``eps`` of the implementation's best logprob (tie-aware:
   our argmax may differ when two tokens are within noise of each other), and
2. every golden top-k token's logprob is within ``topk_atol`` of the golden value, and no other
   token of our top-k beats the golden k-th logprob by more than ``topk_atol``.

The exact-match length of free-running greedy decoding is reported beside it: teacher forcing
and free running see the same inputs until the first step where our argmax differs from the
golden token, so it is the number of leading steps whose argmax equals the golden token.

Anything that can run a sequence through a cache can be verified: a :data:`SessionFactory` takes
a capacity and returns a :data:`StepFn` that appends token ids to its cache and returns the last
position's logits. Adapters exist for infer_ref (:func:`infer_ref_sessions`), transformers'
cached path (:func:`transformers_sessions`) and transformers without a cache
(:func:`transformers_uncached_sessions`, for measuring cached-vs-uncached noise).

Models are either checkpoint folders (the fixture checkpoints) or *synthetic*: a config plus a
seed, with weights drawn by :func:`synthetic_state_dict`, a counter-based generator that gives the
same bits on any CPU or GPU (splitmix64 hashes summed into an Irwin-Hall approximation of a
normal, scaled in float32). Regenerate golden files with ``infer-ref golden generate``; never
edit them by hand.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import platform
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from infer_ref.config import ModelConfig

FORMAT = "infer_ref.golden"
FORMAT_VERSION = 1
DEFAULT_TOP_K = 10
REPO_ROOT = Path(__file__).resolve().parent.parent
GOLDEN_DIR = REPO_ROOT / "fixtures" / "golden"

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
}

# -- tolerances ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tolerance:
    """How close a teacher-forced step must be to the golden one.

    Attributes:
        eps: the golden token's logprob may be at most ``eps`` below our best logprob.
        topk_atol: max |our logprob - golden logprob| over the golden top-k tokens.
        why: where the numbers come from.
    """

    eps: float
    topk_atol: float
    why: str = ""


TOLERANCES: dict[str, Tolerance] = {
    "float64": Tolerance(1e-8, 1e-7, "fp64 implementations agree with transformers to ~1e-10 in logits"),
    "float32": Tolerance(
        1e-4,
        1e-3,
        "fp32 reorderings (fused kernels, cache vs full sequence) move logprobs by ~1e-6..1e-5 on "
        "the fixture checkpoints; 1e-3 leaves two orders of magnitude and still catches any real bug",
    ),
    # bf16: the output logits themselves are bf16 (8 significant bits: a logit between 16 and 32
    # is stored to 1/8), and every layer rounds its activations to bf16, so two correct
    # implementations that order their reductions differently drift apart. Measured on an H100
    # (torch 2.11, transformers 5.17) over the real-shape random models, 288-360 teacher-forced
    # steps each: transformers cached vs uncached up to 0.75 nats on a top-k logprob and 0.125 on
    # the golden token's deficit; infer_ref vs transformers up to 0.875 and 0.125. The tolerances
    # are ~2x and 4x that; docs/golden_report.md has the current numbers.
    "bfloat16": Tolerance(
        0.5,
        1.5,
        "bf16 logits carry 8 significant bits and every layer rounds to bf16: correct implementations "
        "(transformers cached vs uncached, infer_ref vs transformers) differ by up to 0.875 nats on a "
        "top-k logprob and 0.125 on the golden token's deficit over the real-shape models on an H100",
    ),
    "float16": Tolerance(0.25, 0.5, "as bfloat16, with 3 more mantissa bits"),
}


def tolerance_for(dtype: str) -> Tolerance:
    try:
        return TOLERANCES[dtype]
    except KeyError:
        raise ValueError(f"no golden tolerance for dtype {dtype!r}; known: {', '.join(TOLERANCES)}") from None


# -- errors ----------------------------------------------------------------------------------------


class GoldenError(Exception):
    """Base class of golden-file errors."""


class GoldenFormatError(GoldenError):
    """The file is not a golden file this version of infer_ref can read (schema or format version)."""


class GoldenMetadataMismatch(GoldenError):
    """The golden file describes a different run (weights, config, dtype, device type).

    Not an implementation bug: the inputs drifted. ``fields`` maps each differing field to
    ``(value in the file, value of this run)``.
    """

    def __init__(self, path: str, fields: Mapping[str, tuple[Any, Any]]) -> None:
        self.path = path
        self.fields = dict(fields)
        lines = [
            f"golden file {path} does not describe this run (metadata mismatch, not a numerical "
            f"mismatch: nothing was compared). Differing field(s): {', '.join(self.fields)}"
        ]
        for name, (golden, run) in self.fields.items():
            lines.append(f"  {name}: golden file has {_short(golden)}, this run has {_short(run)}")
        lines.append(
            "  If the change is intended, regenerate the file with `infer-ref golden generate ... --force`."
        )
        super().__init__("\n".join(lines))


class GoldenMismatch(GoldenError, AssertionError):
    """The implementation disagrees with the golden file beyond the dtype's tolerance."""

    def __init__(self, message: str, report: VerifyReport) -> None:
        super().__init__(message)
        self.report = report


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


# -- schema ----------------------------------------------------------------------------------------

_Spec = Mapping[str, Any]

_STEP_SPEC: _Spec = {"token": int, "top_ids": [int], "top_logprobs": [float]}
_CASE_SPEC: _Spec = {
    "name": str,
    "prompt_text": (str, type(None)),
    "prompt_ids": [int],
    "steps": [_STEP_SPEC],
}
_SCHEMA: _Spec = {
    "format": str,
    "format_version": int,
    "model": {
        "name": str,
        "source": str,
        "model_type": str,
        "hf_config": dict,
        "config_fingerprint": str,
        "weights_digest": str,
    },
    "run": {
        "dtype": str,
        "device": str,
        "device_name": str,
        "torch": str,
        "transformers": str,
        "python": str,
        "generator": str,
    },
    "sampling": {"strategy": str, "max_new_tokens": int, "stop_on_eos": bool, "eos_token_ids": [int], "top_k": int},
    "cases": [_CASE_SPEC],
}


def _check(value: Any, spec: Any, where: str, errors: list[str]) -> None:
    if isinstance(spec, Mapping):
        if not isinstance(value, Mapping):
            errors.append(f"{where}: expected an object, got {type(value).__name__}")
            return
        for key, sub in spec.items():
            if key not in value:
                errors.append(f"{where}.{key}: missing")
            else:
                _check(value[key], sub, f"{where}.{key}", errors)
    elif isinstance(spec, list):
        if not isinstance(value, list):
            errors.append(f"{where}: expected a list, got {type(value).__name__}")
            return
        for i, item in enumerate(value):
            _check(item, spec[0], f"{where}[{i}]", errors)
            if len(errors) > 20:
                return
    else:
        types = spec if isinstance(spec, tuple) else (spec,)
        if float in types:
            types = (*types, int)
        ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
        if not ok:
            names = "/".join(t.__name__ for t in types)
            errors.append(f"{where}: expected {names}, got {type(value).__name__} {_short(value)}")


def validate(doc: Any, path: str = "<golden>") -> None:
    """Raise :class:`GoldenFormatError` unless ``doc`` is a well-formed golden file of this format version."""
    if not isinstance(doc, Mapping) or doc.get("format") != FORMAT:
        raise GoldenFormatError(f"{path} is not a golden file: expected \"format\": \"{FORMAT}\"")
    version = doc.get("format_version")
    if version != FORMAT_VERSION:
        raise GoldenFormatError(
            f"{path} has format_version {version!r}; this infer_ref reads version {FORMAT_VERSION}. "
            "Regenerate it with `infer-ref golden generate ... --force`."
        )
    errors: list[str] = []
    _check(doc, _SCHEMA, "$", errors)
    if not errors:
        if doc["run"]["dtype"] not in DTYPES:
            errors.append(f"$.run.dtype: unknown dtype {doc['run']['dtype']!r}")
        if doc["model"]["source"] not in ("checkpoint", "synthetic"):
            errors.append(f"$.model.source: expected 'checkpoint' or 'synthetic', got {doc['model']['source']!r}")
        if doc["model"]["source"] == "synthetic" and not isinstance(doc["model"].get("synthetic"), Mapping):
            errors.append("$.model.synthetic: missing (how the weights were generated)")
        if doc["model"]["source"] == "checkpoint" and not isinstance(doc["model"].get("path"), str):
            errors.append("$.model.path: missing (the checkpoint folder)")
        if not doc["cases"]:
            errors.append("$.cases: empty")
        for i, case in enumerate(doc["cases"]):
            if not case["steps"]:
                errors.append(f"$.cases[{i}].steps: empty")
            if not case["prompt_ids"]:
                errors.append(f"$.cases[{i}].prompt_ids: empty")
            for j, step in enumerate(case["steps"]):
                if len(step["top_ids"]) != len(step["top_logprobs"]) or not step["top_ids"]:
                    errors.append(f"$.cases[{i}].steps[{j}]: top_ids and top_logprobs must be non-empty and equally long")
                    break
    if errors:
        more = "" if len(errors) <= 20 else f"\n  ... and {len(errors) - 20} more"
        raise GoldenFormatError(f"{path} fails the golden-file schema:\n  " + "\n  ".join(errors[:20]) + more)


def load_golden(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and validate a golden file."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise GoldenFormatError(f"{path} is not valid JSON: {exc}") from exc
    validate(doc, str(path))
    return doc


def dump_golden(doc: Mapping[str, Any], path: str | os.PathLike[str], *, force: bool = False) -> Path:
    """Validate and write ``doc``; refuse to overwrite an existing file unless ``force``."""
    path = Path(path)
    validate(doc, str(path))
    if path.exists() and not force:
        raise FileExistsError(f"{path} exists; pass --force (force=True) to overwrite a golden file")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(_to_json(doc), encoding="utf-8")
    tmp.replace(path)
    return path


def _to_json(doc: Mapping[str, Any]) -> str:
    """Readable and diffable: lists of numbers on one line, each step on its own line."""
    return _pretty(doc, 0) + "\n"


def _is_scalar(v: Any) -> bool:
    return v is None or isinstance(v, (str, int, float, bool))


def _flat(v: Any) -> bool:
    return _is_scalar(v) or (isinstance(v, list) and all(_is_scalar(x) for x in v))


def _pretty(obj: Any, level: int) -> str:
    pad, inner = " " * level, " " * (level + 1)
    if _flat(obj) or (isinstance(obj, Mapping) and len(obj) <= 4 and all(_flat(v) for v in obj.values())):
        return json.dumps(obj, ensure_ascii=False)
    if isinstance(obj, Mapping):
        items = [f"{inner}{json.dumps(str(k))}: {_pretty(v, level + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}" if items else "{}"
    items = [f"{inner}{_pretty(v, level + 1)}" for v in obj]
    return "[\n" + ",\n".join(items) + "\n" + pad + "]" if items else "[]"


# -- synthetic models ------------------------------------------------------------------------------

_MASK64 = (1 << 64) - 1
_CHUNK = 1 << 24


def _s64(x: int) -> int:
    x &= _MASK64
    return x - (1 << 64) if x >= 1 << 63 else x


_GAMMA = _s64(0x9E3779B97F4A7C15)
_MIX1 = _s64(0xBF58476D1CE4E5B9)
_MIX2 = _s64(0x94D049BB133111EB)
# Sum of four uniform 16-bit integers: mean 4 * 65535 / 2, variance 4 * (65536^2 - 1) / 12.
_IH_MEAN = 2 * 65535
_IH_STD = math.sqrt((65536**2 - 1) / 3)
GENERATOR_NAME = "splitmix64-irwin-hall4-v1"
GENERATOR_DESCRIPTION = (
    "counter-based and device-independent: element i of tensor NAME is z = splitmix64(key + (i+1) * "
    "0x9E3779B97F4A7C15) with key = first 8 bytes (little-endian) of sha256('SEED/NAME'); noise = "
    "(sum of z's four 16-bit lanes - 131070) / 37837.23 (Irwin-Hall(4), unit variance), computed in "
    "int64, then multiplied by the init scale in float32 and rounded to the weight dtype"
)


def _srl(x: Tensor, s: int) -> Tensor:
    """Logical right shift of int64 (torch's >> is arithmetic)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def _noise_into(out: Tensor, key: int, scale: float, offset: float) -> None:
    """Fill flat ``out`` with ``offset + scale * noise``, identical bits on every device."""
    numel = out.numel()
    device = out.device
    factor = torch.tensor(scale / _IH_STD, dtype=torch.float32, device=device)
    flat = out.view(-1)
    for start in range(0, numel, _CHUNK):
        end = min(start + _CHUNK, numel)
        z = torch.arange(start + 1, end + 1, dtype=torch.int64, device=device) * _GAMMA + key
        z = (z ^ _srl(z, 30)) * _MIX1
        z = (z ^ _srl(z, 27)) * _MIX2
        z = z ^ _srl(z, 31)
        lanes = (z & 0xFFFF) + (_srl(z, 16) & 0xFFFF) + (_srl(z, 32) & 0xFFFF) + _srl(z, 48)
        values = (lanes - _IH_MEAN).to(torch.float32) * factor
        if offset:
            values = values + offset
        flat[start:end] = values.to(out.dtype)


def _tensor_key(seed: int, name: str) -> int:
    return _s64(int.from_bytes(hashlib.sha256(f"{seed}/{name}".encode()).digest()[:8], "little"))


def synthetic_state_dict(
    hf_config: Mapping[str, Any],
    seed: int,
    init: Any,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> dict[str, Tensor]:
    """HF-named weights for ``hf_config`` from ``seed``, the same bits on CPU and on any GPU.

    ``init`` is a :class:`SyntheticInit` (or a ``testing.synthetic.WeightInit``): linear weights have std ``gain / sqrt(fan_in)``, embeddings
    ``embed_std``, norm weights ``1 + norm_jitter * noise`` (Gemma stores the offset from 1, so
    just ``norm_jitter * noise``; see ``post_norm_gain``), biases 0.02. See :data:`GENERATOR_DESCRIPTION`.
    """
    from infer_ref.loader import build_on_meta, checkpoint_shapes

    config = ModelConfig.from_hf_dict(hf_config)
    shapes = checkpoint_shapes(build_on_meta(config))
    gemma = config.model_type == "gemma3_text"
    state: dict[str, Tensor] = {}
    for name in sorted(shapes):
        shape = shapes[name]
        post_gain = float(getattr(init, "post_norm_gain", 1.0))
        if gemma and post_gain != 1.0 and name.endswith(("post_attention_layernorm.weight", "post_feedforward_layernorm.weight")):
            # effective weight (1 + w) = post_gain * (1 + jitter * noise)
            scale, offset = post_gain * float(init.norm_jitter), post_gain - 1.0
        elif name.endswith("norm.weight"):
            scale, offset = float(init.norm_jitter), (0.0 if gemma else 1.0)
        elif name == "embed_tokens.weight":
            scale, offset = float(init.embed_std), 0.0
        elif name.endswith(".bias"):
            scale, offset = 0.02, 0.0
        else:
            scale, offset = float(init.gain) / math.sqrt(shape[-1]), 0.0
        tensor = torch.empty(shape, dtype=dtype, device=device)
        _noise_into(tensor, _tensor_key(seed, name), scale, offset)
        state[name if name.startswith("lm_head.") else f"model.{name}"] = tensor
    return state


def weights_digest(state: Mapping[str, Tensor]) -> str:
    """sha256 over names, shapes, dtypes and bytes (``infer_ref.testing.synthetic.state_digest``)."""
    from infer_ref.testing.synthetic import state_digest

    return state_digest(state)


@dataclass(frozen=True)
class SyntheticInit:
    """How synthetic weights are scaled (the fields of ``testing.synthetic.WeightInit``, plus one).

    ``post_norm_gain`` multiplies Gemma's post-attention and post-feedforward norm weights: each
    sub-layer then adds about that RMS to the residual stream. Gemma scales its embeddings by
    sqrt(hidden) and ties them to the head, so with gain 1 the input token's own embedding
    dominates the last hidden state and the model just repeats its input with a margin of ~80
    nats; a gain of 6 makes the attention (the context) and the MLPs dominate instead.
    """

    gain: float = 1.0
    embed_std: float = 1.0
    norm_jitter: float = 0.1
    post_norm_gain: float = 1.0


@dataclass(frozen=True)
class PromptCase:
    """A seeded random prompt: ``prompt_len`` ids drawn from the vocabulary, then ``new_tokens`` greedy steps."""

    name: str
    prompt_len: int
    new_tokens: int
    seed: int


@dataclass(frozen=True)
class SyntheticSpec:
    """A synthetic model: a config, a weight seed and init, and the prompts its golden file holds."""

    name: str
    hf_config: Mapping[str, Any]
    seed: int
    init: SyntheticInit
    cases: tuple[PromptCase, ...]


def _synthetic_specs() -> dict[str, SyntheticSpec]:
    from infer_ref.testing.synthetic import REAL_SHAPE_CONFIGS, tiny_config

    # Logit std ~ embed_std * sqrt(hidden) (tied head over a unit-RMS final norm): 0.15 gives
    # ~5-7 nats, far from uniform over 128k-262k tokens yet with bf16 logits rounded finely
    # enough (1/8 below 32) that a tie-aware eps of a fraction of a nat is meaningful.
    real_init = SyntheticInit(gain=1.0, embed_std=0.15, norm_jitter=0.1)
    gemma_init = SyntheticInit(gain=1.0, embed_std=0.15, norm_jitter=0.1, post_norm_gain=6.0)
    # Gemma's window is 512: the first prompt crosses it in prefill (and decode runs entirely past
    # it); the second starts below it and crosses it during decode, at step 64. 128 new tokens each.
    # Llama and Qwen3 have no window: one long prompt is enough for them.
    prefill_case = PromptCase("prefill-crosses-window", prompt_len=600, new_tokens=128, seed=1)
    decode_case = PromptCase("decode-crosses-window", prompt_len=448, new_tokens=128, seed=2)
    specs = {
        name: SyntheticSpec(name, REAL_SHAPE_CONFIGS[name], seed=0, init=init, cases=cases)
        for name, init, cases in (
            ("llama-3.2-1b", real_init, (prefill_case,)),
            ("qwen3-1.7b", real_init, (prefill_case,)),
            ("gemma-3-1b-it", gemma_init, (prefill_case, decode_case)),
        )
    }
    # Small stand-ins of the same structure (window 16), for dry runs of the GPU flow on CPU.
    standin_cases = (
        PromptCase("prefill-crosses-window", prompt_len=24, new_tokens=24, seed=1),
        PromptCase("decode-crosses-window", prompt_len=10, new_tokens=20, seed=2),
    )
    standin_init = SyntheticInit(gain=1.0, embed_std=0.6, norm_jitter=0.1)
    for family, name in (("llama", "llama-standin"), ("qwen3", "qwen3-standin"), ("gemma3_text", "gemma3-standin")):
        overrides: dict[str, Any] = {"vocab_size": 512}
        if family == "gemma3_text":
            overrides["sliding_window"] = 16
        specs[name] = SyntheticSpec(name, tiny_config(family, **overrides), seed=0, init=standin_init, cases=standin_cases)
    return specs


SYNTHETIC_MODELS: dict[str, SyntheticSpec] = _synthetic_specs()


# -- model sources -----------------------------------------------------------------------------------


@dataclass
class ModelSource:
    """Where a golden file's weights come from, and their identity."""

    name: str
    source: str  # "checkpoint" | "synthetic"
    hf_config: dict[str, Any]
    path: Path | None = None  # checkpoint folder
    spec: SyntheticSpec | None = None
    _state: dict[str, Tensor] | None = field(default=None, repr=False)

    @property
    def config(self) -> ModelConfig:
        return ModelConfig.from_hf_dict(self.hf_config)

    @staticmethod
    def checkpoint(path: str | os.PathLike[str], name: str | None = None) -> ModelSource:
        from infer_ref.paths import resolve_model_path

        folder = resolve_model_path(path)
        hf_config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        return ModelSource(name or folder.name, "checkpoint", hf_config, path=folder)

    @staticmethod
    def synthetic(name: str) -> ModelSource:
        if name not in SYNTHETIC_MODELS:
            raise KeyError(f"unknown synthetic model {name!r}; known: {', '.join(SYNTHETIC_MODELS)}")
        spec = SYNTHETIC_MODELS[name]
        return ModelSource(name, "synthetic", dict(spec.hf_config), spec=spec)

    @staticmethod
    def from_golden(doc: Mapping[str, Any], checkpoint: str | os.PathLike[str] | None = None) -> ModelSource:
        """The model a golden file was written for (``checkpoint`` overrides the recorded folder)."""
        model = doc["model"]
        if model["source"] == "checkpoint":
            recorded = Path(model["path"])
            folder = Path(checkpoint) if checkpoint else (recorded if recorded.is_absolute() else REPO_ROOT / recorded)
            return ModelSource.checkpoint(folder, name=model["name"])
        syn = model["synthetic"]
        name = model["name"]
        init = SyntheticInit(**syn["init"])
        known = SYNTHETIC_MODELS.get(name)
        cases = known.cases if known else ()
        spec = SyntheticSpec(name, dict(model["hf_config"]), seed=int(syn["seed"]), init=init, cases=cases)
        return ModelSource(name, "synthetic", dict(model["hf_config"]), spec=spec)

    def state(self, dtype: torch.dtype, device: str | torch.device) -> dict[str, Tensor]:
        """The weights, HF-named: as stored (checkpoint) or generated in ``dtype`` on ``device`` (synthetic)."""
        if self.source == "checkpoint":
            from infer_ref.loader import read_safetensors

            assert self.path is not None
            return read_safetensors(self.path)
        assert self.spec is not None
        if self._state is None or next(iter(self._state.values())).dtype != dtype:
            self._state = synthetic_state_dict(self.hf_config, self.spec.seed, self.spec.init, dtype=dtype, device=device)
        return self._state

    def digest(self, dtype: torch.dtype, device: str | torch.device) -> str:
        return weights_digest(self.state(dtype, device))

    def metadata(self, dtype: torch.dtype, device: str | torch.device) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "name": self.name,
            "source": self.source,
            "model_type": self.config.model_type,
            "hf_config": self.hf_config,
            "config_fingerprint": self.config.fingerprint(),
            "weights_digest": self.digest(dtype, device),
        }
        if self.source == "checkpoint":
            assert self.path is not None
            meta["path"] = _repo_relative(self.path)
            meta["weights_digest_of"] = "tensors as stored in the checkpoint's safetensors"
        else:
            assert self.spec is not None
            init = self.spec.init
            meta["weights_digest_of"] = f"tensors as generated in {_dtype_name(dtype)}"
            meta["synthetic"] = {
                "seed": self.spec.seed,
                "init": asdict(init),
                "init_description": _init_description(init),
                "generator": GENERATOR_NAME,
                "generator_description": GENERATOR_DESCRIPTION,
                "weights_dtype": _dtype_name(dtype),
                "function": "infer_ref.golden.synthetic_state_dict",
            }
        return meta

    def prompts(self) -> list[dict[str, Any]]:
        """The golden file's prompts: the checkpoint's canonical prompts, or the spec's seeded ones."""
        if self.source == "checkpoint":
            assert self.path is not None
            prov_file = self.path / "PROVENANCE.json"
            if not prov_file.is_file():
                raise FileNotFoundError(f"{prov_file} is missing: it lists the canonical prompts of a fixture checkpoint")
            prov = json.loads(prov_file.read_text(encoding="utf-8"))
            return [
                {
                    "name": f"canonical-{i}",
                    "prompt_text": c["prompt"],
                    "prompt_ids": [int(t) for t in c["prompt_ids"]],
                    "messages": c.get("messages"),
                    "prompt_source": f"{_repo_relative(prov_file)} canonical[{i}]",
                    # the recorded answer (EOS included) and a few more, so generation ends on EOS
                    "max_new_tokens": len(c.get("generated_ids") or []) + 8 if c.get("generated_ids") else 64,
                }
                for i, c in enumerate(prov["canonical"])
            ]
        assert self.spec is not None
        out = []
        for case in self.spec.cases:
            gen = torch.Generator(device="cpu").manual_seed(case.seed)
            ids = torch.randint(0, self.config.vocab_size, (case.prompt_len,), generator=gen).tolist()
            out.append(
                {
                    "name": case.name,
                    "prompt_text": None,
                    "prompt_ids": ids,
                    "max_new_tokens": case.new_tokens,
                    "prompt_source": (
                        f"torch.randint(0, {self.config.vocab_size}, ({case.prompt_len},), "
                        f"generator=torch.Generator('cpu').manual_seed({case.seed}))"
                    ),
                }
            )
        return out

    def tokenizer(self) -> Any:
        """The checkpoint's tokenizer when it has one (for readable failure messages), else None."""
        if self.path is None or not (self.path / "tokenizer.json").is_file():
            return None
        try:
            from infer_ref.tokenizer import Tokenizer

            return Tokenizer(self.path)
        except Exception:
            return None


def _init_description(init: Any) -> str:
    post = getattr(init, "post_norm_gain", 1.0)
    gemma_post = (
        f"; Gemma post-attention/post-feedforward norms {post}*(1 + {init.norm_jitter}*N(0,1)) (stored minus 1)"
        if post != 1.0
        else ""
    )
    return (
        f"linear N(0, ({init.gain}/sqrt(fan_in))^2), embedding N(0, {init.embed_std}^2), norms "
        f"1 + {init.norm_jitter}*N(0,1) (Gemma: the offset only){gemma_post}, biases N(0, 0.02^2); "
        f"N(0,1) approximated by the generator below"
    )


def _repo_relative(path: Path) -> str:
    path = path.resolve()
    try:
        return str(path.relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# -- loading the two implementations ---------------------------------------------------------------------


def load_transformers_model(source: ModelSource, dtype: torch.dtype, device: str | torch.device) -> Any:
    """transformers' ``AutoModelForCausalLM`` for ``source``, loaded by transformers' own code."""
    import transformers

    if source.source == "checkpoint":
        assert source.path is not None
        model: Any = transformers.AutoModelForCausalLM.from_pretrained(str(source.path), dtype=dtype)
        return model.to(device).eval()
    cfg_dict = dict(source.hf_config)
    model_type = cfg_dict.pop("model_type")
    cfg = transformers.AutoConfig.for_model(model_type, **cfg_dict)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    state = source.state(dtype, device)
    missing, unexpected = model.load_state_dict(state, strict=False)
    allowed_missing = {"lm_head.weight"} if cfg.tie_word_embeddings else set()
    if set(missing) - allowed_missing or unexpected:
        raise RuntimeError(f"synthetic weights do not fit transformers' model: missing {missing}, unexpected {unexpected}")
    if cfg.tie_word_embeddings:
        model.tie_weights()
    return model.eval()


def load_infer_ref_model(source: ModelSource, dtype: torch.dtype, device: str | torch.device) -> Any:
    """infer_ref's model for ``source`` (``load_model`` for checkpoints)."""
    if source.source == "checkpoint":
        from infer_ref.loader import load_model

        assert source.path is not None
        model, _ = load_model(source.path, dtype=dtype, device=device)
        return model
    from infer_ref.loader import build_on_meta, load_weights

    state = {
        (k if k.startswith("lm_head.") else k.removeprefix("model.")): v
        for k, v in source.state(dtype, device).items()
    }
    return load_weights(build_on_meta(source.config), state, dtype=dtype, device=device)


# -- "forward with a cache" adapters ---------------------------------------------------------------------

StepFn = Callable[[Sequence[int]], Tensor]
"""Append token ids to the sequence held in a cache; return the logits ``[V]`` of the last one."""
SessionFactory = Callable[[int], StepFn]
"""Start a new sequence with an empty cache able to hold ``max_len`` tokens."""


def infer_ref_sessions(model: Any, *, device: str | torch.device) -> SessionFactory:
    """Sessions over infer_ref's contiguous :class:`~infer_ref.cache.KVCache`."""
    from infer_ref.cache import KVCache

    dtype = next(model.parameters()).dtype

    def start(max_len: int) -> StepFn:
        cache = KVCache.from_model_config(model.config, max_len, dtype=dtype, device=device)

        @torch.inference_mode()
        def step(ids: Sequence[int]) -> Tensor:
            x = torch.tensor([list(ids)], dtype=torch.long, device=device)  # [1, T]
            return model(x, kv_cache=cache)[0, -1]  # [V]

        return step

    return start


def transformers_sessions(model: Any) -> SessionFactory:
    """Sessions over transformers' own cached path (the ``DynamicCache`` its forward creates)."""
    device = next(model.parameters()).device

    def start(max_len: int) -> StepFn:
        state: dict[str, Any] = {"cache": None}

        @torch.inference_mode()
        def step(ids: Sequence[int]) -> Tensor:
            x = torch.tensor([list(ids)], dtype=torch.long, device=device)
            out = model(input_ids=x, past_key_values=state["cache"], use_cache=True, logits_to_keep=1)
            state["cache"] = out.past_key_values
            return out.logits[0, -1]

        return step

    return start


def transformers_uncached_sessions(model: Any) -> SessionFactory:
    """transformers recomputing the whole sequence at every step (no cache): the noise reference."""
    device = next(model.parameters()).device

    def start(max_len: int) -> StepFn:
        seq: list[int] = []

        @torch.inference_mode()
        def step(ids: Sequence[int]) -> Tensor:
            seq.extend(int(t) for t in ids)
            x = torch.tensor([seq], dtype=torch.long, device=device)
            return model(input_ids=x, use_cache=False, logits_to_keep=1).logits[0, -1]

        return step

    return start


# -- writing ---------------------------------------------------------------------------------------------


def device_name(device: str | torch.device) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()})"


def _versions() -> dict[str, str]:
    import transformers

    return {"torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version()}


def _top(lp: Tensor, k: int, ndigits: int | None = 6) -> tuple[list[int], list[float]]:
    """Top-k of logprobs ``lp``; exact ties (common with bf16 logits) ordered by id, as argmax orders them."""
    values, ids = lp.topk(min(k + 8, lp.numel()))
    pairs = sorted(zip(ids.tolist(), values.tolist(), strict=True), key=lambda p: (-p[1], p[0]))[:k]
    return [int(i) for i, _ in pairs], [float(v) if ndigits is None else round(float(v), ndigits) for _, v in pairs]


@torch.inference_mode()
def write_golden(
    source: ModelSource,
    *,
    dtype: str,
    device: str,
    top_k: int = DEFAULT_TOP_K,
    max_new_tokens: int | None = None,
    stop_on_eos: bool | None = None,
    progress: Callable[[int], None] | None = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Build a golden document with transformers' ``generate`` (greedy) on ``source``.

    Checkpoints: their canonical prompts, stopping at EOS (``max_new_tokens`` default 64).
    Synthetic models: their seeded prompts, a fixed number of new tokens, EOS ignored.
    ``progress`` is called with the number of tokens generated after each prompt.
    """

    torch_dtype = DTYPES[dtype]
    t0 = time.perf_counter()
    model = load_transformers_model(source, torch_dtype, device)
    _log(log, f"loaded {source.name} into transformers in {time.perf_counter() - t0:.1f}s")
    t0 = time.perf_counter()
    synthetic = source.source == "synthetic"
    stop = (not synthetic) if stop_on_eos is None else stop_on_eos
    eos_ids = [int(t) for t in source.config.eos_token_ids]
    # No EOS at all when stopping is off: generate must not stop or mask anything.
    model.generation_config.eos_token_id = eos_ids if stop else None
    attn = getattr(model.config, "_attn_implementation", "default")
    cases = []
    longest = 0
    for prompt in source.prompts():
        n_new = max_new_tokens or prompt.get("max_new_tokens") or 64
        longest = max(longest, n_new)
        ids = torch.tensor([prompt["prompt_ids"]], dtype=torch.long, device=device)
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=n_new,
            eos_token_id=eos_ids if stop else None,
            pad_token_id=source.config.pad_token_id if source.config.pad_token_id is not None else 0,
            output_logits=True,
            return_dict_in_generate=True,
        )
        generated = out.sequences[0, ids.shape[1] :].tolist()
        steps = []
        for i, token in enumerate(generated):
            lp = torch.log_softmax(out.logits[i][0].to(torch.float64), dim=-1)
            top_ids, top_lps = _top(lp, top_k)
            if lp[token] < lp.max():
                raise RuntimeError(
                    f"transformers' generate chose token {token} at step {i} of {prompt['name']!r}, which is not "
                    f"the argmax of its raw logits ({top_ids[0]}): a logits processor is active; golden files "
                    "must be plain greedy"
                )
            steps.append({"token": int(token), "top_ids": top_ids, "top_logprobs": top_lps})
        case = {k: v for k, v in prompt.items() if k != "max_new_tokens"}
        case["max_new_tokens"] = n_new
        case["steps"] = steps
        cases.append(case)
        if progress:
            progress(len(generated))
    _log(log, f"generated {sum(len(c['steps']) for c in cases)} tokens in {time.perf_counter() - t0:.1f}s")
    t0 = time.perf_counter()
    model_meta = source.metadata(torch_dtype, device)
    _log(log, f"weights digest in {time.perf_counter() - t0:.1f}s")
    versions = _versions()
    doc: dict[str, Any] = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "description": (
            "Golden tokens written by transformers (the oracle), greedy. Verify teacher-forced with "
            "`infer-ref golden verify FILE`; regenerate with `infer-ref golden generate` (see run.command)."
        ),
        "model": model_meta,
        "run": {
            "dtype": dtype,
            "device": torch.device(device).type,
            "device_name": device_name(device),
            **versions,
            "generator": (
                f"transformers {versions['transformers']} {type(model).__name__}.generate(do_sample=False, "
                f"output_logits=True), its default DynamicCache, attn_implementation={attn}; logprobs = "
                "log_softmax in float64 of the raw logits"
            ),
            "command": _generate_command(source, dtype, device),
        },
        "sampling": {
            "strategy": "greedy",
            "temperature": 0.0,
            "max_new_tokens": longest,
            "stop_on_eos": stop,
            "eos_token_ids": eos_ids if stop else [],
            "top_k": top_k,
        },
        "tolerance": asdict(tolerance_for(dtype)),
        "cases": cases,
    }
    validate(doc)
    return doc


def _generate_command(source: ModelSource, dtype: str, device: str) -> str:
    what = f"--checkpoint {_repo_relative(source.path)}" if source.path is not None else f"--synthetic {source.name}"
    return f"infer-ref golden generate {what} --dtype {dtype} --device {torch.device(device).type} --force"


def _log(log: Callable[[str], None] | None, message: str) -> None:
    if log is not None:
        log(message)


def default_golden_path(source_name: str, dtype: str, device: str, folder: Path = GOLDEN_DIR) -> Path:
    return folder / f"{source_name}.{torch.device(device).type}-{dtype}.json"


# -- verification ------------------------------------------------------------------------------------------


def check_metadata(
    doc: Mapping[str, Any],
    source: ModelSource,
    *,
    dtype: str,
    device: str,
    path: str = "<golden>",
) -> list[str]:
    """Raise :class:`GoldenMetadataMismatch` if the golden file does not describe this run.

    Compared: config fingerprint, weights digest, dtype, device type. Returns notes about fields
    that differ without invalidating the comparison (device name, torch/transformers versions).
    """
    torch_dtype = DTYPES[dtype]
    model = doc["model"]
    fields: dict[str, tuple[Any, Any]] = {}
    if doc["run"]["dtype"] != dtype:
        fields["dtype"] = (doc["run"]["dtype"], dtype)
    run_device = torch.device(device).type
    if doc["run"]["device"] != run_device:
        fields["device"] = (doc["run"]["device"], run_device)
    fingerprint = source.config.fingerprint()
    if model["config_fingerprint"] != fingerprint:
        fields["config_fingerprint"] = (model["config_fingerprint"], fingerprint)
    if model["model_type"] != source.config.model_type:
        fields["model_type"] = (model["model_type"], source.config.model_type)
    if "dtype" not in fields:  # synthetic weights are generated in the run dtype: digest only comparable then
        digest = source.digest(torch_dtype, device)
        if model["weights_digest"] != digest:
            fields["weights_digest"] = (model["weights_digest"], digest)
    if fields:
        raise GoldenMetadataMismatch(path, fields)
    notes = []
    here = {"device_name": device_name(device), **_versions()}
    for key, value in here.items():
        if doc["run"].get(key) != value:
            notes.append(f"{key}: golden file {doc['run'].get(key)!r}, this run {value!r}")
    return notes


@dataclass
class StepFailure:
    """One teacher-forced step outside tolerance."""

    step: int
    position: int  # where the golden token goes in the sequence (prompt length + step)
    golden_token: int
    our_token: int
    golden_token_lp: float  # our logprob of the golden token
    best_lp: float  # our best logprob
    deficit: float  # best_lp - golden_token_lp
    worst_token: int  # the top-k token with the largest |Δ|
    worst_delta: float
    golden_top: list[tuple[int, float]]
    our_top: list[tuple[int, float]]
    golden_margin: float  # golden top1 - top2
    reasons: list[str]


@dataclass
class CaseResult:
    name: str
    prompt_len: int
    steps: int
    free_match: int  # free-running exact-match length
    max_abs_dlogprob: float  # over golden top-k tokens, all steps
    max_deficit: float  # max over steps of (our best - our logprob of golden token)
    min_golden_margin: float  # min over steps of golden top1 - top2
    golden_margins: list[float]
    failures: list[StepFailure]


@dataclass
class VerifyReport:
    path: str
    impl: str
    dtype: str
    device: str
    tolerance: Tolerance
    cases: list[CaseResult]
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(c.failures for c in self.cases)

    @property
    def free_match(self) -> int:
        return sum(c.free_match for c in self.cases)

    @property
    def total_steps(self) -> int:
        return sum(c.steps for c in self.cases)

    @property
    def max_abs_dlogprob(self) -> float:
        return max(c.max_abs_dlogprob for c in self.cases)

    @property
    def max_deficit(self) -> float:
        return max(c.max_deficit for c in self.cases)

    @property
    def min_golden_margin(self) -> float:
        return min(c.min_golden_margin for c in self.cases)

    def summary(self) -> str:
        status = "PASS" if self.ok else "FAIL"
        per_case = ", ".join(f"{c.name} {c.free_match}/{c.steps}" for c in self.cases)
        return (
            f"{status} {self.path} [{self.impl}, {self.dtype} on {self.device}]: free-running match {per_case}; "
            f"max |Δlogprob| {self.max_abs_dlogprob:.3g} (tol {self.tolerance.topk_atol}), max deficit "
            f"{self.max_deficit:.3g} (eps {self.tolerance.eps}), min golden margin {self.min_golden_margin:.3g}"
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> VerifyReport:
        cases = []
        for c in data["cases"]:
            failures = [
                StepFailure(**{**f, "golden_top": [tuple(p) for p in f["golden_top"]], "our_top": [tuple(p) for p in f["our_top"]]})
                for f in c["failures"]
            ]
            cases.append(CaseResult(**{**c, "failures": failures}))
        return VerifyReport(
            path=data["path"], impl=data["impl"], dtype=data["dtype"], device=data["device"],
            tolerance=Tolerance(**data["tolerance"]), cases=cases, notes=list(data.get("notes", [])),
        )

    def raise_for_failures(self, token_text: Callable[[int], str] | None = None) -> None:
        if not self.ok:
            raise GoldenMismatch(format_failure(self, token_text), self)


def _fmt_top(top: Sequence[tuple[int, float]], token_text: Callable[[int], str] | None) -> str:
    def one(t: int, lp: float) -> str:
        text = f" {token_text(t)!r}" if token_text else ""
        return f"{t}{text}:{lp:.4f}"

    return "[" + ", ".join(one(t, lp) for t, lp in top) + "]"


def format_failure(report: VerifyReport, token_text: Callable[[int], str] | None = None) -> str:
    """The readable diff of a failed verification: the first failing step of each failing case."""

    def tok(t: int) -> str:
        return f"{t} ({token_text(t)!r})" if token_text else str(t)

    lines = [
        f"golden mismatch: {report.path} [{report.impl}, {report.dtype} on {report.device}] — "
        f"teacher-forced logprobs differ beyond the {report.dtype} tolerance "
        f"(eps {report.tolerance.eps}, top-k atol {report.tolerance.topk_atol})"
    ]
    for case in report.cases:
        if not case.failures:
            continue
        f = case.failures[0]
        lines += [
            f"  case {case.name!r} (prompt {case.prompt_len} tokens): {len(case.failures)} of {case.steps} steps fail; "
            f"first at step {f.step} (token position {f.position})",
            f"    golden token {tok(f.golden_token)}: logprob {f.golden_token_lp:.4f} here; our best is "
            f"{tok(f.our_token)} at {f.best_lp:.4f}: margin (our best - golden) {f.deficit:.4f}",
            f"    golden margin at this step (top1 - top2 in the golden file): {f.golden_margin:.4f}",
            f"    largest top-k |Δlogprob| {f.worst_delta:.4f} at token {tok(f.worst_token)}",
            f"    golden top-k: {_fmt_top(f.golden_top, token_text)}",
            f"    our top-k:    {_fmt_top(f.our_top, token_text)}",
            f"    why: {'; '.join(f.reasons)}",
            f"    free-running exact match: {case.free_match} of {case.steps} tokens",
        ]
    lines.append(f"  repro: infer-ref golden verify {report.path} --impl {report.impl} --device {report.device}")
    return "\n".join(lines)


def verify_case(
    case: Mapping[str, Any],
    start: SessionFactory,
    tol: Tolerance,
    *,
    max_failures: int = 1000,
) -> CaseResult:
    """Teacher-force one case's golden tokens through a fresh session; compare every step."""
    prompt = [int(t) for t in case["prompt_ids"]]
    steps = case["steps"]
    step_fn = start(len(prompt) + len(steps))
    logits = step_fn(prompt)
    free_match = 0
    diverged = False
    max_abs = 0.0
    max_deficit = 0.0
    margins: list[float] = []
    failures: list[StepFailure] = []
    for i, golden in enumerate(steps):
        lp = torch.log_softmax(logits.detach().to(torch.float64), dim=-1).cpu()
        g_token = int(golden["token"])
        g_ids = [int(t) for t in golden["top_ids"]]
        g_lps = [float(v) for v in golden["top_logprobs"]]
        k = len(g_ids)
        our_top = list(zip(*_top(lp, k, ndigits=None), strict=True))
        best_token, best_lp = our_top[0]
        golden_lp_here = float(lp[g_token])
        deficit = best_lp - golden_lp_here
        deltas = [abs(float(lp[t]) - v) for t, v in zip(g_ids, g_lps, strict=True)]
        worst = max(range(k), key=lambda j: deltas[j])
        # Tokens of our top-k outside the golden top-k must not beat the golden k-th by more than atol.
        kth = g_lps[-1]
        intruders = [(t, v) for t, v in our_top if t not in set(g_ids) and v > kth + tol.topk_atol]
        margin = g_lps[0] - g_lps[1] if k > 1 else math.inf
        margins.append(margin)
        max_abs = max(max_abs, deltas[worst])
        max_deficit = max(max_deficit, deficit)
        if not diverged and best_token == g_token:
            free_match += 1
        else:
            diverged = True
        reasons = []
        if deficit > tol.eps:
            reasons.append(f"golden token is {deficit:.4g} below our best (> eps {tol.eps})")
        if deltas[worst] > tol.topk_atol:
            reasons.append(f"top-k |Δlogprob| {deltas[worst]:.4g} > {tol.topk_atol}")
        if intruders:
            t, v = intruders[0]
            reasons.append(
                f"token {t} is in our top-k at {v:.4f} but below the golden top-k (golden k-th {kth:.4f})"
            )
        if reasons and len(failures) < max_failures:
            failures.append(
                StepFailure(
                    step=i,
                    position=len(prompt) + i,
                    golden_token=g_token,
                    our_token=best_token,
                    golden_token_lp=golden_lp_here,
                    best_lp=best_lp,
                    deficit=deficit,
                    worst_token=g_ids[worst],
                    worst_delta=deltas[worst],
                    golden_top=list(zip(g_ids, g_lps, strict=True)),
                    our_top=our_top,
                    golden_margin=margin,
                    reasons=reasons,
                )
            )
        if i + 1 < len(steps):
            logits = step_fn([g_token])  # teacher forcing: always the golden token
    finite = [m for m in margins if math.isfinite(m)]
    return CaseResult(
        name=str(case["name"]),
        prompt_len=len(prompt),
        steps=len(steps),
        free_match=free_match,
        max_abs_dlogprob=max_abs,
        max_deficit=max_deficit,
        min_golden_margin=min(finite) if finite else math.inf,
        golden_margins=margins,
        failures=failures,
    )


def verify(
    doc: Mapping[str, Any],
    start: SessionFactory,
    *,
    impl: str,
    device: str,
    path: str = "<golden>",
    tolerance: Tolerance | None = None,
    progress: Callable[[int], None] | None = None,
) -> VerifyReport:
    """Verify every case of ``doc`` through ``start`` (metadata must already be checked)."""
    dtype = doc["run"]["dtype"]
    tol = tolerance or tolerance_for(dtype)
    cases = []
    for case in doc["cases"]:
        cases.append(verify_case(case, start, tol))
        if progress:
            progress(len(case["steps"]))
    return VerifyReport(path=path, impl=impl, dtype=dtype, device=torch.device(device).type, tolerance=tol, cases=cases)


IMPLEMENTATIONS = ("infer_ref", "transformers", "transformers-uncached")
"""Built-in implementations; any conformance adapter is also accepted as ``module:OBJECT``."""


def adapter_model(adapter: Any, source: ModelSource, dtype: torch.dtype, device: str) -> Any:
    """``adapter.load_model`` on the golden file's model: its checkpoint folder, or the synthetic
    weights written once as an HF snapshot (``config.json`` + safetensors) in a temporary folder."""
    assert adapter.load_model is not None
    if source.source == "checkpoint":
        assert source.path is not None
        return adapter.load_model(source.path, dtype, device)
    import tempfile

    from infer_ref.testing.synthetic import write_snapshot

    state = {name: t.to("cpu") for name, t in source.state(dtype, device).items()}  # generated on the device: fast
    with tempfile.TemporaryDirectory(prefix="infer_ref_golden_") as tmp:
        folder = write_snapshot(Path(tmp) / source.name, source.hf_config, state)
        del state
        return adapter.load_model(folder, dtype, device)


def adapter_sessions(adapter: Any, model: Any, *, device: str | torch.device) -> SessionFactory:
    """Sessions through a conformance adapter: its ``make_model_cache`` and ``forward``."""
    assert adapter.make_model_cache is not None and adapter.forward is not None

    def start(max_len: int) -> StepFn:
        cache = adapter.make_model_cache(model, max_len, 1)

        def step(ids: Sequence[int]) -> Tensor:
            x = torch.tensor([list(ids)], dtype=torch.long, device=device)  # [1, T]
            return adapter.forward(model, x, cache)[0, -1]  # [V]

        return step

    return start


def sessions_for(impl: str, source: ModelSource, dtype: str, device: str) -> SessionFactory:
    """Load ``source`` with implementation ``impl`` (a built-in name or ``module:ADAPTER``) and
    return its session factory."""
    torch_dtype = DTYPES[dtype]
    if ":" in impl:
        from infer_ref.testing.adapter import load_adapter

        adapter = load_adapter(impl)
        missing = [f for f in ("load_model", "make_model_cache", "forward") if getattr(adapter, f) is None]
        if missing:
            raise ValueError(f"--impl {impl}: adapter {adapter.name!r} has no {', '.join(missing)}; golden files need all three")
        return adapter_sessions(adapter, adapter_model(adapter, source, torch_dtype, device), device=device)
    if impl == "infer_ref":
        return infer_ref_sessions(load_infer_ref_model(source, torch_dtype, device), device=device)
    if impl == "transformers":
        return transformers_sessions(load_transformers_model(source, torch_dtype, device))
    if impl == "transformers-uncached":
        return transformers_uncached_sessions(load_transformers_model(source, torch_dtype, device))
    raise ValueError(f"unknown implementation {impl!r}; known: {', '.join(IMPLEMENTATIONS)}")


def verify_file(
    path: str | os.PathLike[str],
    *,
    impl: str = "infer_ref",
    device: str | None = None,
    checkpoint: str | os.PathLike[str] | None = None,
    sessions: SessionFactory | None = None,
    source: ModelSource | None = None,
    raise_on_failure: bool = True,
    progress: Callable[[int], None] | None = None,
) -> VerifyReport:
    """Load, check metadata, verify teacher-forced; raise :class:`GoldenMismatch` on failure.

    ``sessions`` verifies any implementation (default: load ``impl`` from the file's model).
    """
    doc = load_golden(path)
    shown = _repo_relative(Path(path))
    device = device or doc["run"]["device"]
    dtype = doc["run"]["dtype"]
    source = source or ModelSource.from_golden(doc, checkpoint)
    notes = check_metadata(doc, source, dtype=dtype, device=device, path=shown)
    start = sessions or sessions_for(impl, source, dtype, device)
    report = verify(doc, start, impl=impl, device=device, path=shown, progress=progress)
    report.notes = notes
    if raise_on_failure:
        tk = source.tokenizer()
        report.raise_for_failures((lambda t: tk.decode([t], skip_special_tokens=False)) if tk else None)
    return report


def total_steps(doc: Mapping[str, Any]) -> int:
    return sum(len(c["steps"]) for c in doc["cases"])


# -- planted bugs ------------------------------------------------------------------------------------------


def _no_window_on_decode() -> Callable[..., Any]:
    from infer_ref.models import common

    original = common.attention_mask

    def buggy(q_len: int, start: int, window: int | None, device: torch.device | str) -> Tensor | None:
        if q_len == 1:
            window = None  # the bug: decode steps forget the sliding window
        return original(q_len, start, window, device)

    return buggy


PLANTED_BUGS: dict[str, Callable[[], Callable[..., Any]]] = {
    "sliding-window-decode-mask": _no_window_on_decode,
}
"""Known bugs that can be planted into infer_ref (for showing that golden files catch them)."""


@contextlib.contextmanager
def planted_bug(name: str) -> Iterator[None]:
    """Temporarily plant a known bug into infer_ref's model code."""
    from infer_ref.models import common

    if name not in PLANTED_BUGS:
        raise KeyError(f"unknown planted bug {name!r}; known: {', '.join(PLANTED_BUGS)}")
    original = common.attention_mask
    common.attention_mask = PLANTED_BUGS[name]()
    try:
        yield
    finally:
        common.attention_mask = original


def margin_percentiles(margins: Sequence[float], qs: Sequence[float] = (0.0, 0.01, 0.05, 0.25, 0.5)) -> list[float]:
    finite = sorted(m for m in margins if math.isfinite(m))
    if not finite:
        return [math.nan for _ in qs]
    return [finite[min(len(finite) - 1, int(q * (len(finite) - 1) + 0.5))] for q in qs]
