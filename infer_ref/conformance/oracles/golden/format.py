"""The golden file format: schema, integrity checks, content digest, reading and atomic writing.

A golden file is refused (:class:`~infer_ref.conformance.oracles.golden.errors.GoldenFormatError`) unless

* it has this format and version and every field of the schema, with the right types;
* its counts agree with its metadata: the number of cases and of steps per case recorded in
  ``integrity``, top-k lists of ``sampling.top_k`` entries, and as many steps as the case's
  ``max_new_tokens`` (or fewer, ending at the first EOS, when ``stop_on_eos``);
* case names are unique, every token id is in ``[0, vocab_size)`` of its config, and every
  log-prob is finite, at most 0 and in non-increasing order, the golden token first;
* the sha256 of its content (everything but ``integrity.sha256``, as canonical JSON) is the one
  recorded when it was written, so any edit, truncation or duplication is reported, never passed.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping
from itertools import pairwise
from pathlib import Path
from typing import Any

import torch

from infer_ref.conformance.oracles.golden.errors import GoldenFormatError, short_repr
from infer_ref.fileio import atomic_write_text

FORMAT = "infer_ref.golden"
FORMAT_VERSION = 2  # 2: the integrity block (counts and content digest)
DEFAULT_TOP_K = 10
REPO_ROOT = Path(__file__).resolve().parents[4]
GOLDEN_DIR = REPO_ROOT / "fixtures" / "golden"

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
}

MAX_ERRORS = 20

_Spec = Mapping[str, Any]

_STEP_SPEC: _Spec = {"token": int, "top_ids": [int], "top_logprobs": [float]}
_CASE_SPEC: _Spec = {
    "name": str,
    "prompt_text": (str, type(None)),
    "prompt_ids": [int],
    "max_new_tokens": int,
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
_SYNTHETIC_SPEC: _Spec = {
    "seed": int,
    "init": {"gain": float, "embed_std": float, "norm_jitter": float, "post_norm_gain": float},
}
_INTEGRITY_SPEC: _Spec = {"cases": int, "steps_per_case": [int], "sha256": str}


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
            if len(errors) > MAX_ERRORS:
                return
    else:
        types = spec if isinstance(spec, tuple) else (spec,)
        if float in types:
            types = (*types, int)
        ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
        if not ok:
            names = "/".join(t.__name__ for t in types)
            errors.append(f"{where}: expected {names}, got {type(value).__name__} {short_repr(value)}")


def _raise(errors: list[str], path: str) -> None:
    if errors:
        more = "" if len(errors) <= MAX_ERRORS else f"\n  ... and {len(errors) - MAX_ERRORS} more"
        raise GoldenFormatError(f"{path} fails the golden-file schema:\n  " + "\n  ".join(errors[:MAX_ERRORS]) + more)


def validate(doc: Any, path: str = "<golden>", *, sealed: bool = True) -> None:
    """Raise :class:`GoldenFormatError` unless ``doc`` is a well-formed golden file of this format version.

    ``sealed``: the integrity block must be present and match (every file read from disk);
    ``write_golden`` and ``dump_golden`` validate the document before sealing it.
    """
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
    _raise(errors, path)
    _check_metadata_fields(doc, errors)
    _check_cases(doc, errors)
    _raise(errors, path)
    if sealed:
        _check_integrity(doc, path)


def _check_metadata_fields(doc: Mapping[str, Any], errors: list[str]) -> None:
    if doc["run"]["dtype"] not in DTYPES:
        errors.append(f"$.run.dtype: unknown dtype {doc['run']['dtype']!r}")
    if doc["model"]["source"] not in ("checkpoint", "synthetic"):
        errors.append(f"$.model.source: expected 'checkpoint' or 'synthetic', got {doc['model']['source']!r}")
    if doc["model"]["source"] == "synthetic":
        _check(doc["model"].get("synthetic"), _SYNTHETIC_SPEC, "$.model.synthetic", errors)
    if doc["model"]["source"] == "checkpoint" and not isinstance(doc["model"].get("path"), str):
        errors.append("$.model.path: missing (the checkpoint folder)")
    if doc["sampling"]["top_k"] < 1:
        errors.append(f"$.sampling.top_k: expected >= 1, got {doc['sampling']['top_k']}")


def _vocab_size(doc: Mapping[str, Any], errors: list[str]) -> int | None:
    from infer_ref.config import ConfigError, ModelConfig

    try:
        return ModelConfig.from_hf_dict(doc["model"]["hf_config"]).vocab_size
    except ConfigError as err:
        errors.append(f"$.model.hf_config: {err}")
        return None


def _check_cases(doc: Mapping[str, Any], errors: list[str]) -> None:
    """Counts against the metadata, unique names, id ranges, finite and ordered log-probs."""
    cases = doc["cases"]
    if not cases:
        errors.append("$.cases: empty")
    vocab = _vocab_size(doc, errors)
    sampling = doc["sampling"]
    eos = set(sampling["eos_token_ids"])
    seen: dict[str, int] = {}
    for i, case in enumerate(cases):
        where = f"$.cases[{i}]"
        if case["name"] in seen:
            errors.append(f"{where}.name: {case['name']!r} repeats $.cases[{seen[case['name']]}] (case names are unique)")
        seen.setdefault(case["name"], i)
        if not case["prompt_ids"]:
            errors.append(f"{where}.prompt_ids: empty")
        if vocab is not None:
            _check_ids(case["prompt_ids"], vocab, f"{where}.prompt_ids", errors)
        _check_step_count(case, sampling, eos, where, errors)
        for j, step in enumerate(case["steps"]):
            _check_step(step, vocab, min(sampling["top_k"], vocab or sampling["top_k"]), f"{where}.steps[{j}]", errors)
            if len(errors) > MAX_ERRORS:
                return


def _check_step_count(case: Mapping[str, Any], sampling: Mapping[str, Any], eos: set[int], where: str, errors: list[str]) -> None:
    steps, limit = case["steps"], case["max_new_tokens"]
    if limit > sampling["max_new_tokens"]:
        errors.append(f"{where}.max_new_tokens: {limit} exceeds $.sampling.max_new_tokens {sampling['max_new_tokens']}")
    tokens = [s["token"] for s in steps]
    first_eos = next((k for k, t in enumerate(tokens) if t in eos), None) if sampling["stop_on_eos"] else None
    expected = limit if first_eos is None else min(first_eos + 1, limit)
    if len(steps) != expected:
        why = f"ends at its first EOS, step {first_eos}" if first_eos is not None else f"max_new_tokens is {limit}"
        errors.append(f"{where}.steps: {len(steps)} steps, expected {expected} ({why}): a truncated or extended case")


def _check_ids(ids: list[int], vocab: int, where: str, errors: list[str]) -> None:
    bad = [(k, t) for k, t in enumerate(ids) if not 0 <= t < vocab]
    if bad:
        k, t = bad[0]
        errors.append(f"{where}[{k}]: token id {t} is outside [0, {vocab}) (the config's vocab_size)")


def _check_step(step: Mapping[str, Any], vocab: int | None, top_k: int, where: str, errors: list[str]) -> None:
    ids, lps = step["top_ids"], step["top_logprobs"]
    if len(ids) != len(lps) or not ids:
        errors.append(f"{where}: top_ids and top_logprobs must be non-empty and equally long")
        return
    if len(ids) != top_k:
        errors.append(f"{where}: {len(ids)} top-k entries, expected $.sampling.top_k = {top_k}")
    if vocab is not None:
        _check_ids([step["token"]], vocab, f"{where}.token", errors)
        _check_ids(ids, vocab, f"{where}.top_ids", errors)
    if len(set(ids)) != len(ids):
        errors.append(f"{where}.top_ids: repeated ids {ids}")
    if not all(math.isfinite(v) for v in lps):
        errors.append(f"{where}.top_logprobs: non-finite log-prob(s) {lps}: expected finite values <= 0")
    elif max(lps) > 0 or any(a < b for a, b in pairwise(lps)):
        errors.append(f"{where}.top_logprobs: expected values <= 0 in non-increasing order, got {lps}")
    if ids[0] != step["token"]:
        errors.append(f"{where}.token: {step['token']} is not the first of top_ids {ids[:3]}...: greedy tokens are the argmax")


# -- integrity -------------------------------------------------------------------------------------


def content_digest(doc: Mapping[str, Any]) -> str:
    """sha256 of the canonical JSON of ``doc`` without ``integrity.sha256`` (key order and layout do not matter)."""
    body = dict(doc)
    integrity = dict(body.get("integrity") or {})
    integrity.pop("sha256", None)
    body["integrity"] = integrity
    blob = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return hashlib.sha256(blob).hexdigest()


def seal(doc: Mapping[str, Any]) -> dict[str, Any]:
    """``doc`` with its ``integrity`` block (re)computed: case and step counts, content digest."""
    out = {k: v for k, v in doc.items() if k != "integrity"}
    out["integrity"] = {
        "cases": len(out["cases"]),
        "steps_per_case": [len(c["steps"]) for c in out["cases"]],
        "what": "sha256 of the canonical JSON (sorted keys, no spaces) of this document without integrity.sha256",
    }
    out["integrity"]["sha256"] = content_digest(out)
    return out


def _check_integrity(doc: Mapping[str, Any], path: str) -> None:
    integrity = doc.get("integrity")
    errors: list[str] = []
    if integrity is None:
        errors.append("$.integrity: missing (the counts and content digest recorded when the file was written)")
    else:
        _check(integrity, _INTEGRITY_SPEC, "$.integrity", errors)
    _raise(errors, path)
    assert isinstance(integrity, Mapping)
    cases = doc["cases"]
    if integrity["cases"] != len(cases):
        errors.append(f"$.cases: {len(cases)} cases, but the file was written with {integrity['cases']}")
    steps = [len(c["steps"]) for c in cases]
    if integrity["steps_per_case"] != steps:
        errors.append(f"$.cases[*].steps: {steps} steps per case, but the file was written with {integrity['steps_per_case']}")
    digest = content_digest(doc)
    if integrity["sha256"] != digest:
        errors.append(
            f"$.integrity.sha256: the content digest is {digest}, the file records {integrity['sha256']}: "
            "the file was edited, truncated or merged after it was written (regenerate it, never edit it by hand)"
        )
    _raise(errors, path)


# -- reading and writing ---------------------------------------------------------------------------


def load_golden(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and validate a golden file (schema, counts, ranges, finite values, content digest)."""
    path = Path(path)
    if path.is_dir():
        raise GoldenFormatError(f"{path} is a folder: expected a golden .json file")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise GoldenFormatError(f"{path} is not valid JSON: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise GoldenFormatError(f"{path} is not UTF-8 text: {exc}") from exc
    validate(doc, str(path))
    return doc


def dump_golden(doc: Mapping[str, Any], path: str | os.PathLike[str], *, force: bool = False) -> Path:
    """Validate, seal and write ``doc`` atomically; refuse to overwrite an existing file unless ``force``."""
    path = Path(path)
    validate(doc, str(path), sealed=False)
    return atomic_write_text(path, _to_json(seal(doc)), overwrite=force)


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
