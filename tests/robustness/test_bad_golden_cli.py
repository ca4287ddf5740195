"""``infer-ref golden``: a golden file of a device this machine lacks, an unknown ``--device``, a
checkpoint folder without weights, an output path in a folder that does not exist. Each is one
line naming the file or option and what is expected, with its documented exit status, refused
before any work (nothing verified, nothing written, no folder created).

The command lines run in one subprocess (``cli_driver.py``), as in ``test_bad_cli.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from infer_ref.errors import EXIT_MISSING, EXIT_USAGE

ROOT = Path(__file__).resolve().parents[2]
LLAMA = ROOT / "fixtures" / "checkpoints" / "llama-tiny"
GOLDEN = ROOT / "fixtures" / "golden" / "llama-tiny.cpu-float32.json"
CUDA_GOLDEN = ROOT / "fixtures" / "golden" / "llama-tiny.cuda-bfloat16.json"
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "INFER_REF_MODELS": "", "TOKENIZERS_PARALLELISM": "false"}


class Tmp:
    """The scratch folder of the cases: a snapshot copy without weights, and nothing else."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.no_weights = Path(shutil.copytree(LLAMA, root / "no-weights"))
        (self.no_weights / "model.safetensors").unlink()
        self.missing = root / "not-made"  # a folder no case may create

    def listing(self) -> list[str]:
        """Every path under the scratch folder but the results the CUDA cases write on purpose."""
        return sorted(str(p.relative_to(self.root)) for p in self.root.rglob("*") if not p.name.startswith("cuda."))


Argv = Callable[[Tmp], list[str]]
VERIFY = ["golden", "verify", "--quiet"]
REPORT = ["golden", "report", "--quiet"]

# (id, argv, exit status, words in the one-line message)
CASES: list[tuple[str, Argv, int, tuple[str, ...]]] = [
    ("verify-unknown-device", lambda t: [*VERIFY, str(GOLDEN), "--device", "warp9", "--json", str(t.root / "v.json")],
     EXIT_USAGE, ("unsupported device 'warp9'", "expected cpu, cuda or cuda:N")),
    ("report-unknown-device", lambda t: [*REPORT, str(GOLDEN), "--device", "warp9", "--out", str(t.root / "r.md")],
     EXIT_USAGE, ("unsupported device 'warp9'", "expected cpu, cuda or cuda:N")),
    ("generate-checkpoint-without-weights", lambda t: ["golden", "generate", "--checkpoint", str(t.no_weights), "--out",
                                                       str(t.root / "g.json"), "--quiet"],
     EXIT_MISSING, ("no-weights has no model.safetensors or model.safetensors.index.json",)),
    ("verify-checkpoint-without-weights", lambda t: [*VERIFY, str(GOLDEN), "--checkpoint", str(t.no_weights)],
     EXIT_MISSING, ("no-weights has no model.safetensors",)),
    ("verify-json-into-missing-folder", lambda t: [*VERIFY, str(GOLDEN), "--json", str(t.missing / "r.json")],
     EXIT_MISSING, ("output path", "not-made does not exist")),
    ("verify-json-folder-name", lambda t: [*VERIFY, str(GOLDEN), "--json", str(t.missing) + os.sep],
     EXIT_USAGE, ("not-made/", "is a folder: expected a file path")),
    ("report-out-into-missing-folder", lambda t: [*REPORT, str(GOLDEN), "--out", str(t.missing / "r.md")],
     EXIT_MISSING, ("not-made does not exist",)),
    ("report-json-into-missing-folder", lambda t: [*REPORT, str(GOLDEN), "--out", str(t.root / "r.md"), "--json",
                                                   str(t.missing / "r.json")],
     EXIT_MISSING, ("not-made does not exist",)),
]

# Only meaningful where torch has no CUDA (the default tier's machines).
CUDA_CASES: list[tuple[str, Argv, int, tuple[str, ...]]] = [
    ("verify-cuda-file-without-cuda", lambda t: [*VERIFY, str(CUDA_GOLDEN), "--json", str(t.root / "cuda.json")],
     EXIT_USAGE, ("llama-tiny.cuda-bfloat16.json records a run on cuda", "needs a CUDA device", "--device")),
    ("report-cuda-file-without-cuda", lambda t: [*REPORT, str(CUDA_GOLDEN), "--out", str(t.root / "cuda.md")],
     EXIT_USAGE, ("llama-tiny.cuda-bfloat16.json records a run on cuda", "needs a CUDA device", "--device")),
]


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> tuple[Tmp, list[str], dict[str, Any]]:
    tmp = Tmp(tmp_path_factory.mktemp("golden-cli"))
    before = tmp.listing()
    argvs = [[case_id, build(tmp)] for case_id, build, _, _ in CASES + CUDA_CASES]
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("cli_driver.py"))],
        input=json.dumps(argvs), capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    return tmp, before, json.loads(proc.stdout)


def _check(result: dict[str, Any], code: int, words: tuple[str, ...]) -> None:
    shown = result["stderr"] + result["stdout"]
    assert result["code"] == code, (result["code"], shown)
    assert "Traceback" not in shown
    for word in words:
        assert word in shown, (word, shown)
    errors = [line for line in shown.splitlines() if "error:" in line]
    assert len(errors) == 1, shown  # one line
    assert "PASS" not in shown and "FAIL" not in shown  # refused before any verification


@pytest.mark.parametrize(("case_id", "code", "words"), [c[0:1] + c[2:] for c in CASES], ids=[f"golden-cli-{c[0]}" for c in CASES])
def test_golden_cli_refuses_before_any_work(ran: tuple[Tmp, list[str], dict[str, Any]], case_id: str, code: int,
                                           words: tuple[str, ...]) -> None:
    tmp, before, results = ran
    _check(results[case_id], code, words)
    assert tmp.listing() == before  # nothing written, no folder made, the snapshot copy untouched
    assert not tmp.missing.exists()


@pytest.mark.parametrize(("case_id", "code", "words"), [c[0:1] + c[2:] for c in CUDA_CASES],
                         ids=[f"golden-cli-{c[0]}" for c in CUDA_CASES])
def test_golden_cli_cuda_file_on_a_machine_without_cuda(ran: tuple[Tmp, list[str], dict[str, Any]], case_id: str, code: int,
                                                        words: tuple[str, ...]) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the file can be verified here")
    tmp, before, results = ran
    _check(results[case_id], code, words)
    assert tmp.listing() == before
    # Both report the refusal in their outputs like any other verdict (the folder exists).
    if case_id.startswith("verify"):
        written = json.loads((tmp.root / "cuda.json").read_text(encoding="utf-8"))
        assert [(r["impl"], r["exit_code"]) for r in written] == [("infer_ref", EXIT_USAGE)]
        assert "needs a CUDA device" in written[0]["message"]
    else:
        assert "ERROR (exit 2): error: " in (tmp.root / "cuda.md").read_text(encoding="utf-8")
