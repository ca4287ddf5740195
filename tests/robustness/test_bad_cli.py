"""The ``infer-ref`` command: every user error is one line and a documented exit status, never a traceback.

The command lines run in a subprocess (``cli_driver.py``: one interpreter for every case, exactly
``infer_ref.cli.main`` as the console script calls it); a few run as separate processes, where the
process itself matters (a closed pipe, the console entry point).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file, save_file

from infer_ref.conformance.oracles import golden
from infer_ref.errors import (
    EXIT_BAD_DATA,
    EXIT_BROKEN_PIPE,
    EXIT_METADATA,
    EXIT_MISSING,
    EXIT_OK,
    EXIT_REFUSED_OVERWRITE,
    EXIT_USAGE,
)

ROOT = Path(__file__).resolve().parents[2]
LLAMA = ROOT / "fixtures" / "checkpoints" / "llama-tiny"
GOLDEN = ROOT / "fixtures" / "golden" / "llama-tiny.cpu-float32.json"
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "INFER_REF_MODELS": "", "TOKENIZERS_PARALLELISM": "false"}


def _copy(tmp: Path, name: str, breakage: Callable[[Path], None] | None = None) -> str:
    folder = Path(shutil.copytree(LLAMA, tmp / name))
    if breakage is not None:
        breakage(folder)
    return str(folder)


def _nan_weight(folder: Path) -> None:
    state = load_file(str(folder / "model.safetensors"))
    state["model.norm.weight"][3] = math.nan
    save_file(state, str(folder / "model.safetensors"))


def _tampered_golden(tmp: Path) -> str:
    doc = json.loads(GOLDEN.read_text(encoding="utf-8"))
    doc["cases"][0]["steps"] = doc["cases"][0]["steps"][:1]
    path = tmp / "tampered.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return str(path)


def _other_run_golden(tmp: Path) -> str:
    doc = golden.load_golden(GOLDEN)
    doc["model"]["weights_digest"] = "0" * 64
    path = tmp / "other-run.json"
    path.write_text(json.dumps(golden.seal(doc)), encoding="utf-8")
    return str(path)


class Tmp:
    """The scratch files of the CLI cases, made once per module."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.folder = root / "a-folder"
        self.folder.mkdir()
        self.existing = root / "existing.json"
        self.existing.write_text("keep me", encoding="utf-8")
        self.bad_lines = root / "reuse.jsonl"
        self.bad_lines.write_text("{not json\n", encoding="utf-8")

    def copy(self, name: str, breakage: Callable[[Path], None] | None = None) -> str:
        return _copy(self.root, name, breakage)


def _bad_eps(folder: Path) -> None:
    text = (folder / "config.json").read_text(encoding="utf-8")
    (folder / "config.json").write_text(text.replace('"rms_norm_eps": 1e-05', '"rms_norm_eps": -1'), encoding="utf-8")


GEN = ["generate", "--device", "cpu", "--max-new-tokens", "4"]
SYN = ["golden", "generate", "--synthetic", "llama-standin"]
Argv = Callable[[Tmp], list[str]]

# (id, argv, exit status, words in the one-line message)
CASES: list[tuple[str, Argv, int, tuple[str, ...]]] = [
    ("unknown-model", lambda t: ["generate", "--model", "no-such-model"], EXIT_USAGE, ("'no-such-model' was not found",)),
    ("device-mps", lambda t: [*GEN, "--device", "mps"], EXIT_USAGE, ("unsupported device 'mps'",)),
    ("device-garbage", lambda t: [*GEN, "--device", "warp9"], EXIT_USAGE, ("unsupported device 'warp9'", "expected cpu, cuda")),
    ("device-cuda-index", lambda t: [*GEN, "--device", "cuda:7"], EXIT_USAGE, ("'cuda:7'",)),
    ("max-new-tokens-huge", lambda t: [*GEN, "--max-new-tokens", "100000"], EXIT_USAGE, ("exceeds the model's context",)),
    ("max-new-tokens-zero", lambda t: [*GEN, "--max-new-tokens", "0"], EXIT_USAGE, ("max_new_tokens", "0")),
    ("max-new-tokens-negative", lambda t: [*GEN, "--max-new-tokens", "-5"], EXIT_USAGE, ("max_new_tokens", "-5")),
    ("max-new-tokens-not-int", lambda t: [*GEN, "--max-new-tokens", "ten"], EXIT_USAGE, ("--max-new-tokens", "'ten'")),
    ("temperature-negative", lambda t: [*GEN, "--temperature", "-1"], EXIT_USAGE, ("temperature must be >= 0", "-1")),
    ("temperature-nan", lambda t: [*GEN, "--temperature", "nan"], EXIT_USAGE, ("temperature", "nan")),
    ("temperature-inf", lambda t: [*GEN, "--temperature", "inf"], EXIT_USAGE, ("temperature", "inf")),
    ("seed-2-pow-64", lambda t: [*GEN, "--temperature", "1", "--seed", str(2**64)], EXIT_USAGE, ("seed", str(2**64))),
    ("seed-negative", lambda t: [*GEN, "--seed", "-1"], EXIT_USAGE, ("seed", "-1")),
    ("top-k-zero", lambda t: [*GEN, "--top-k", "0"], EXIT_USAGE, ("top_k", "0")),
    ("top-p-above-one", lambda t: [*GEN, "--top-p", "1.5"], EXIT_USAGE, ("top_p", "1.5")),
    ("top-p-zero", lambda t: [*GEN, "--top-p", "0"], EXIT_USAGE, ("top_p", "0.0")),
    ("threads-zero", lambda t: [*GEN, "--threads", "0"], EXIT_USAGE, ("--threads", "0")),
    ("dtype-int8", lambda t: [*GEN, "--dtype", "int8"], EXIT_USAGE, ("invalid choice: 'int8'",)),
    ("fast-without-cache", lambda t: [*GEN, "--fast", "--no-kv-cache"], EXIT_USAGE, ("cannot be combined with --no-kv-cache",)),
    ("compile-without-fast", lambda t: [*GEN, "--compile"], EXIT_USAGE, ("add --fast",)),
    ("empty-prompt", lambda t: [*GEN, "", "--no-chat", "--model", "qwen3-tiny"], EXIT_USAGE, ("prompt_token_ids is empty",)),
    ("compile-on-cpu", lambda t: [*GEN, "--fast", "--compile"], EXIT_USAGE, ("--compile needs a CUDA device",)),
    ("corrupt-safetensors", lambda t: [*GEN, "--model", t.copy("corrupt", lambda f: (f / "model.safetensors").write_bytes(b"\0" * 16))],
     EXIT_BAD_DATA, ("model.safetensors",)),
    ("config-not-json", lambda t: [*GEN, "--model", t.copy("cfg", lambda f: (f / "config.json").write_text("{", encoding="utf-8"))],
     EXIT_BAD_DATA, ("config.json",)),
    ("config-bad-field", lambda t: [*GEN, "--model", t.copy("cfg2", _bad_eps)], EXIT_BAD_DATA, ("rms_norm_eps", "-1")),
    ("nan-weight", lambda t: [*GEN, "--model", t.copy("nan", _nan_weight)], EXIT_BAD_DATA, ("norm.weight", "non-finite weights")),
    ("nan-weight-unchecked", lambda t: [*GEN, "--model", t.copy("nan2", _nan_weight), "--no-check-weights"], EXIT_BAD_DATA,
     ("non-finite logits at step 0",)),
    ("tokenizer-corrupt", lambda t: [*GEN, "--model", t.copy("tok", lambda f: (f / "tokenizer.json").write_text("{", encoding="utf-8"))],
     EXIT_BAD_DATA, ("tokenizer.json",)),
    ("tokenizer-missing", lambda t: [*GEN, "--model", t.copy("tok2", lambda f: (f / "tokenizer.json").unlink())], EXIT_MISSING,
     ("holds no tokenizer.json",)),
    ("model-empty-folder", lambda t: [*GEN, "--model", str(t.folder)], EXIT_MISSING, ("a folder without config.json",)),
    ("model-a-file", lambda t: [*GEN, "--model", str(t.existing)], EXIT_MISSING, ("existing.json is a file",)),
    ("golden-verify-missing", lambda t: ["golden", "verify", str(t.root / "nope.json")], EXIT_MISSING, ("nope.json",)),
    ("golden-verify-tampered", lambda t: ["golden", "verify", _tampered_golden(t.root), "--quiet"], EXIT_BAD_DATA,
     ("1 steps, expected 38",)),
    ("golden-verify-folder", lambda t: ["golden", "verify", str(t.folder), "--quiet"], EXIT_BAD_DATA, ("is a folder",)),
    ("golden-verify-other-run", lambda t: ["golden", "verify", _other_run_golden(t.root), "--quiet"], EXIT_METADATA, ("weights_digest",)),
    ("golden-verify-json-folder", lambda t: ["golden", "verify", str(GOLDEN), "--json", str(t.folder)], EXIT_USAGE, ("is a folder",)),
    ("golden-verify-bad-checkpoint", lambda t: ["golden", "verify", str(GOLDEN), "--quiet", "--checkpoint",
                                                t.copy("vbad", lambda f: (f / "model.safetensors").write_bytes(b"x"))],
     EXIT_BAD_DATA, ("model.safetensors",)),
    ("golden-generate-name-escapes", lambda t: [*SYN, "--name", "../x", "--out-dir", str(t.folder)], EXIT_USAGE,
     ("'../x'", "plain file name")),
    ("golden-generate-out-folder", lambda t: [*SYN, "--out", str(t.folder), "--force"], EXIT_USAGE, ("a-folder", "folders")),
    ("golden-generate-exists", lambda t: [*SYN, "--out", str(t.existing)], EXIT_REFUSED_OVERWRITE, ("existing.json", "--force")),
    ("golden-generate-two-models-one-name", lambda t: [*SYN, "qwen3-standin", "--name", "a"], EXIT_USAGE, ("exactly one model",)),
    ("golden-generate-top-k-zero", lambda t: [*SYN, "--top-k", "0", "--out-dir", str(t.folder)], EXIT_USAGE, ("--top-k", "0")),
    ("golden-generate-bad-device", lambda t: [*SYN, "--device", "warp9", "--out-dir", str(t.folder)], EXIT_USAGE, ("'warp9'",)),
    ("golden-generate-missing-checkpoint", lambda t: ["golden", "generate", "--checkpoint", str(t.root / "nowhere"), "--out-dir",
                                                      str(t.folder)], EXIT_MISSING, ("nowhere",)),
    ("golden-report-out-folder", lambda t: ["golden", "report", str(GOLDEN), "--out", str(t.folder), "--quiet"], EXIT_USAGE,
     ("is a folder",)),
    ("golden-report-bad-reuse", lambda t: ["golden", "report", str(GOLDEN), "--out", str(t.root / "r.md"), "--reuse", str(t.bad_lines),
                                           "--quiet"], EXIT_BAD_DATA, ("reuse.jsonl:1",)),
    ("golden-unknown-synthetic", lambda t: [*SYN[:3], "gpt-9"], EXIT_USAGE, ("invalid choice: 'gpt-9'",)),
    ("golden-no-subcommand", lambda t: ["golden"], EXIT_USAGE, ("required",)),
    ("no-command", lambda t: [], EXIT_USAGE, ()),
]


# Inputs that are accepted, with the result that shows why: --temperature 1e-40 used to divide the
# logits into inf - inf = NaN; softmax(l / T) tends to the one-hot of the argmax as T -> 0.
ACCEPTED: list[tuple[str, Argv]] = [
    ("tiny-temperature", lambda t: [*GEN, "--json", "--temperature", "1e-40", "--seed", "3", "--max-new-tokens", "8"]),
    ("greedy", lambda t: [*GEN, "--json", "--max-new-tokens", "8"]),
]


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> tuple[Tmp, dict[str, Any]]:
    """Every case of both tables, run once in one subprocess."""
    tmp = Tmp(tmp_path_factory.mktemp("cli"))
    argvs = [[case_id, build(tmp)] for case_id, build, _, _ in CASES] + [[case_id, build(tmp)] for case_id, build in ACCEPTED]
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("cli_driver.py"))],
        input=json.dumps(argvs), capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    return tmp, json.loads(proc.stdout)


@pytest.mark.parametrize(("case_id", "code", "words"), [(c[0], c[2], c[3]) for c in CASES], ids=[f"cli-{c[0]}" for c in CASES])
def test_user_error_is_one_line_and_a_documented_exit_status(
    ran: tuple[Tmp, dict[str, Any]], case_id: str, code: int, words: tuple[str, ...]
) -> None:
    tmp, results = ran
    result = results[case_id]
    shown = result["stderr"] + result["stdout"]
    assert result["code"] == code, (result["code"], shown)
    assert "Traceback" not in shown
    for word in words:
        assert word in shown, (word, shown)
    if not case_id.startswith(("golden-verify", "no-command")):  # verify prints each file's verdict on stdout
        # One line, naming the problem (argparse adds its usage lines before its one error line).
        lines = [line for line in result["stderr"].splitlines() if "error" in line]
        assert len(lines) == 1, result["stderr"]
    # Refused outputs are untouched, and nothing stray is left next to them.
    assert tmp.existing.read_text(encoding="utf-8") == "keep me"
    assert sorted(p.name for p in tmp.folder.iterdir()) == []
    assert not list(tmp.root.glob(".*.tmp")) and not (tmp.root / "x.cpu-float32.json").exists()


def test_user_errors_are_caught_but_bugs_keep_their_traceback() -> None:
    from infer_ref.errors import run_reporting_user_errors

    def bug() -> int:
        raise KeyError("a bug")

    with pytest.raises(KeyError, match="a bug"):
        run_reporting_user_errors(bug, "infer-ref")


def test_cli_broken_pipe_exits_quietly() -> None:
    """`infer-ref generate | head -c 1`: the reader goes away; no traceback, no 'Exception ignored'."""
    proc = subprocess.Popen([sys.executable, "-m", "infer_ref.cli", "generate", "--device", "cpu", "--max-new-tokens", "4"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV, cwd=ROOT)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before anything is written: the first flush fails
    err = proc.stderr.read().decode()
    code = proc.wait(timeout=300)
    assert code == EXIT_BROKEN_PIPE and "Traceback" not in err and "Exception ignored" not in err, (code, err)


def test_cli_tiny_temperature_is_accepted_and_gives_the_greedy_tokens(ran: tuple[Tmp, dict[str, Any]]) -> None:
    _, results = ran
    tiny, greedy = results["tiny-temperature"], results["greedy"]
    assert tiny["code"] == greedy["code"] == EXIT_OK, tiny["stderr"] + greedy["stderr"]
    assert json.loads(tiny["stdout"])["token_ids"] == json.loads(greedy["stdout"])["token_ids"]
