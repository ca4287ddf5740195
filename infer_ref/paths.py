"""Resolving model names to local snapshot folders.

infer_ref never downloads anything. A model is named either by a local path (a snapshot folder in
Hugging Face layout, or for tokenizers a ``tokenizer.json`` file) or by a name that is looked up
under the folder given by the ``INFER_REF_MODELS`` environment variable::

    INFER_REF_MODELS=/data/models
    "meta-llama/Llama-3.2-1B-Instruct"  ->  /data/models/meta-llama/Llama-3.2-1B-Instruct
                                        or  /data/models/Llama-3.2-1B-Instruct
"""

from __future__ import annotations

import os
import pathlib

from infer_ref.errors import UsageError

__all__ = [
    "FIXTURE_CHECKPOINTS", "MODELS_ENV_VAR", "check_not_ambiguous", "require_config", "require_snapshot", "require_weights", "resolve_model_path",
]

MODELS_ENV_VAR = "INFER_REF_MODELS"


def _fixture_checkpoints() -> pathlib.Path:
    """The embedded fixture checkpoints (llama-tiny, qwen3-tiny, gemma3-tiny): in a checkout of the
    repository, beside the package; from a wheel, in the install's data folder
    (``PREFIX/share/infer_ref/checkpoints``, pyproject's ``data-files``), found from where the
    package sits (``PREFIX/lib/pythonX.Y/site-packages``, ``PREFIX/Lib/site-packages``, or PREFIX
    itself for ``pip install --target PREFIX``) so that every kind of install finds its own."""
    package = pathlib.Path(__file__).resolve().parent
    checkout = package.parent / "fixtures" / "checkpoints"
    if checkout.is_dir():
        return checkout
    for prefix in (package.parents[3], package.parents[2], package.parent):  # lib/pythonX.Y/site-packages, Lib/site-packages, --target
        installed = prefix / "share" / "infer_ref" / "checkpoints"
        if installed.is_dir():
            return installed
    return checkout  # neither: callers say that the kit's own checkpoints are not there


FIXTURE_CHECKPOINTS = _fixture_checkpoints()


def _candidates(name: str) -> list[pathlib.Path]:
    """Folders under ``$INFER_REF_MODELS`` that ``name`` may refer to, most specific first."""
    root = os.environ.get(MODELS_ENV_VAR)
    if not root:
        return []
    base = pathlib.Path(root).expanduser()
    out = [base / name]
    last = pathlib.PurePath(name).name
    if last and last != name:
        out.append(base / last)
    return out


def resolve_model_path(name_or_path: str | os.PathLike[str]) -> pathlib.Path:
    """Return the local path that ``name_or_path`` names.

    Order of lookup:

    1. ``name_or_path`` itself, if it exists (a snapshot folder or a file);
    2. ``$INFER_REF_MODELS/<name_or_path>``;
    3. ``$INFER_REF_MODELS/<last path component>`` (``"meta-llama/Llama-3.2-1B"`` ->
       ``$INFER_REF_MODELS/Llama-3.2-1B``).

    Raises:
        FileNotFoundError: nothing was found. The message says that nothing is downloaded and how
            to point infer_ref at a local snapshot.
    """
    path = pathlib.Path(name_or_path).expanduser()
    if path.exists():
        return path
    name = os.fspath(name_or_path)
    tried = _candidates(name)
    for cand in tried:
        if cand.exists():
            return cand
    looked = ", ".join(str(c) for c in tried)
    where = f" Looked under ${MODELS_ENV_VAR}: {looked}." if tried else f" ${MODELS_ENV_VAR} is not set."
    raise FileNotFoundError(
        f"model {name!r} was not found: no such local file or folder. infer_ref never downloads "
        f"anything (no model hub access). Point at a local snapshot folder (config.json, "
        f"*.safetensors, tokenizer.json), or set {MODELS_ENV_VAR} to a folder holding snapshots so "
        f"that names resolve as ${MODELS_ENV_VAR}/<name> or ${MODELS_ENV_VAR}/<last part of name>." + where
    )


def check_not_ambiguous(name: str, builtin: pathlib.Path, found: pathlib.Path) -> None:
    """Refuse a bare model name that names two folders: a built-in one and one the user has.

    ``found`` is what :func:`resolve_model_path` gives for ``name`` (a folder in the working
    directory, or under ``$INFER_REF_MODELS``). Neither is preferred: running the fixture when the
    user meant their own snapshot (or the reverse) gives plausible output from the wrong model. A
    path (``./name``, an absolute path) is never ambiguous.
    """
    if found.resolve() == builtin.resolve():
        return
    raise UsageError(
        f"model name {name!r} is ambiguous: it names the embedded fixture {builtin} and the folder "
        f"{found.resolve()}; pass a path to pick one (./{name} for a folder in the working directory, "
        f"or the full path of either)"
    )


def require_snapshot(folder: pathlib.Path, option: str = "") -> None:
    """Raise ``FileNotFoundError`` unless ``folder`` holds ``config.json`` (:func:`require_config`)
    and the weights (:func:`require_weights`): the files every load reads first, checked before
    torch is imported."""
    require_config(folder, option)
    require_weights(folder)


def require_config(folder: pathlib.Path, option: str = "") -> None:
    """Raise ``FileNotFoundError`` unless ``folder`` is a folder holding ``config.json``; ``option``
    (``--model``, ``--model-dir``) names where the folder was given."""
    if (folder / "config.json").is_file():
        return
    named = f"{option} {folder}" if option else str(folder)
    what = "is a file" if folder.is_file() else "is a folder without config.json" if folder.is_dir() else "does not exist"
    raise FileNotFoundError(f"{named} {what}: expected a Hugging Face snapshot folder (config.json, "
                            "model.safetensors or its index, tokenizer.json)")


def require_weights(folder: pathlib.Path) -> None:
    """Raise ``FileNotFoundError`` naming ``folder`` unless it holds ``model.safetensors`` or a shard index.

    Called before any work by whatever will read the weights (the loader, golden generation).
    """
    if not (folder / "model.safetensors").is_file() and not (folder / "model.safetensors.index.json").is_file():
        raise FileNotFoundError(
            f"{folder} has no model.safetensors or model.safetensors.index.json: expected a Hugging Face snapshot"
        )
