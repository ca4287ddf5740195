"""Every command line the docs show names what is there and is accepted as written: each
``infer-ref`` line by the command's parser (options renamed or removed fail here; what it does is
run by test_readme.py, test_adapter_examples.py and test_cli_startup.py), each script a line runs
(``python scripts/X.py``, ``bash scripts/X.sh``) exists, and each ``python -m MODULE`` is importable.
Cheap: nothing is run."""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

import pytest

from infer_ref.cli.conformance import check_pytest_options
from infer_ref.cli.main import _command_named, build_parser
from infer_ref.conformance.engines.registry import RECORDS

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
ENV = re.compile(r"^[A-Z_][A-Z0-9_]*=\S*$")  # OUT=dir in front of a command


def documented_commands() -> list[tuple[str, list[str]]]:
    """(``page:line``, words) of every command in the pages' bash blocks, continuations joined,
    comments and leading variable assignments dropped, split at ``&&``, ``;`` and ``|``."""
    out = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for block in re.finditer(r"```(?:bash|sh|shell)\n(.*?)```", text, flags=re.DOTALL):
            first_line = text[: block.start()].count("\n") + 2
            for offset, line in enumerate(block.group(1).replace("\\\n", " ").splitlines()):
                for part in re.split(r"&&|;|\|", line.split(" #", 1)[0]):
                    try:
                        words = shlex.split(part)
                    except ValueError:
                        continue  # a line quoting across the split (a pipe inside quotes): not a command of ours
                    while words and ENV.match(words[0]):
                        words = words[1:]
                    if words:
                        out.append((f"{page.name}:{first_line + offset}", words))
    return out


def _ours(prefix: tuple[str, ...]) -> list[tuple[str, list[str]]]:
    return [(where, words) for where, words in documented_commands() if tuple(words[: len(prefix)]) == prefix]


INFER_REF = _ours(("infer-ref",))
SCRIPTS = [(w, words) for w, words in documented_commands()
           if words[0] in ("python", "python3", "bash") and len(words) > 1 and words[1].startswith("scripts/")]  # fmt: skip
MODULES = [
    (w, words) for w, words in documented_commands() if words[:2] in (["python", "-m"], ["python3", "-m"])
]


# modules the docs run in another Python: each engine's venv (its registry record), the mutation tool
OTHER_PYTHONS = {r.module for r in RECORDS if r.module} | {"mutmut", "pip", "venv"}


def test_the_docs_show_commands_of_each_kind() -> None:
    assert len(INFER_REF) > 20 and SCRIPTS and MODULES, (len(INFER_REF), len(SCRIPTS), len(MODULES))


@pytest.mark.parametrize(("where", "words"), INFER_REF, ids=[w for w, _ in INFER_REF])
def test_each_infer_ref_command_line_is_accepted_as_written(where: str, words: list[str]) -> None:
    argv = words[1:]
    parser = build_parser(_command_named(argv))
    try:
        args, extra = parser.parse_known_args(argv)
    except SystemExit as exit:  # --help answers 0; a refusal fails the test
        assert exit.code == 0, f"{where}: {shlex.join(words)} refused"
        return
    if extra:
        assert getattr(args, "pass_through", False), f"{where}: unrecognized {extra}"
        check_pytest_options(extra)  # conformance hands them to pytest: pytest must take them


@pytest.mark.parametrize(("where", "words"), SCRIPTS, ids=[w for w, _ in SCRIPTS])
def test_each_script_a_command_runs_is_there(where: str, words: list[str]) -> None:
    assert (ROOT / words[1]).is_file(), f"{where}: {shlex.join(words)}"


@pytest.mark.parametrize(("where", "words"), MODULES, ids=[w for w, _ in MODULES])
def test_each_module_a_command_runs_is_importable(where: str, words: list[str]) -> None:
    module = words[2]
    top = module.split(".")[0]
    if top in OTHER_PYTHONS:
        return  # run in an engine's venv, or a tool of its own install
    assert importlib.util.find_spec(module) is not None, f"{where}: no module {module}"
