"""Runs ``infer-ref`` command lines in this process, one after another, as the console script would.

Reads ``[[case_id, [argv...]], ...]`` as JSON on stdin and prints ``{case_id: {"code", "stdout",
"stderr"}}``. An exception that escapes ``main`` is what a user would see as a traceback: it is
recorded in ``stderr`` with its traceback and the code ``"uncaught"``. One interpreter for every
case keeps the CLI suite to seconds (importing torch dominates a fresh process).
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import traceback


def run_one(argv: list[str]) -> dict[str, object]:
    from infer_ref.cli import main

    out, err = io.StringIO(), io.StringIO()
    code: object
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exit_:  # argparse's usage errors
            code = exit_.code
        except BaseException:
            traceback.print_exc()
            code = "uncaught"
    return {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()}


if __name__ == "__main__":
    cases = json.load(sys.stdin)
    print(json.dumps({case_id: run_one(argv) for case_id, argv in cases}))
