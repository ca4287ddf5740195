"""Where a golden file's weights come from (a checkpoint folder or a synthetic spec), their identity,
and loading them into each implementation (infer_ref, transformers)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from infer_ref.config import ConfigError, ModelConfig, read_json_object
from infer_ref.conformance.checkpoints.golden_models import (
    GENERATOR_DESCRIPTION,
    GENERATOR_NAME,
    SYNTHETIC_MODELS,
    SyntheticInit,
    SyntheticSpec,
    synthetic_state_dict,
    weights_digest,
)
from infer_ref.conformance.oracles.golden.format import REPO_ROOT
from infer_ref.loader import CheckpointError


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
        from infer_ref.paths import require_snapshot, resolve_model_path

        folder = resolve_model_path(path)
        require_snapshot(folder)  # before any work: transformers' OSError would come after minutes of setup
        hf_config = read_json_object(folder / "config.json", ConfigError)
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
            meta["path"] = repo_relative(self.path)
            meta["weights_digest_of"] = "tensors as stored in the checkpoint's safetensors"
        else:
            assert self.spec is not None
            init = self.spec.init
            meta["weights_digest_of"] = f"tensors as generated in {dtype_name(dtype)}"
            meta["synthetic"] = {
                "seed": self.spec.seed,
                "init": asdict(init),
                "init_description": _init_description(init),
                "generator": GENERATOR_NAME,
                "generator_description": GENERATOR_DESCRIPTION,
                "weights_dtype": dtype_name(dtype),
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
            prov = read_json_object(prov_file, CheckpointError)
            if not isinstance(prov.get("canonical"), list):
                raise CheckpointError(f"{prov_file}: expected a 'canonical' list of prompts")
            return [
                {
                    "name": f"canonical-{i}",
                    "prompt_text": c["prompt"],
                    "prompt_ids": [int(t) for t in c["prompt_ids"]],
                    "messages": c.get("messages"),
                    "prompt_source": f"{repo_relative(prov_file)} canonical[{i}]",
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


def repo_relative(path: Path) -> str:
    path = path.resolve()
    try:
        return str(path.relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def dtype_name(dtype: torch.dtype) -> str:
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
