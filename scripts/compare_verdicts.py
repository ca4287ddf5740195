"""Exit 1 unless two JUnit XML reports give every test they share the same verdict.

    python scripts/compare_verdicts.py [--judged-only] offline.xml server.xml

The engine tier's vLLM run in-process and through its OpenAI-compatible server must agree test by
test (passed / failed / skipped / expected failure); tests in only one report are listed, not judged.
``--judged-only``: only the tests the second report judged (not skipped) are compared, for a server
that can be asked fewer things than the engine in-process (llama_cpp.server takes text prompts
only); its skips are counted, and none judged is no failure.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET


def verdicts(path: str) -> dict[str, str]:
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        kinds = {child.tag for child in case}
        if "failure" in kinds or "error" in kinds:
            out[name] = "failed"
        elif "skipped" in kinds:
            skipped = case.find("skipped")
            out[name] = "xfailed" if skipped is not None and skipped.get("type") == "pytest.xfail" else "skipped"
        else:
            out[name] = "passed"
    return out


def main(argv: list[str]) -> int:
    judged_only = argv[:1] == ["--judged-only"]
    argv = argv[1:] if judged_only else argv
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    a, b = verdicts(argv[0]), verdicts(argv[1])
    shared = sorted(set(a) & set(b))
    if judged_only:
        skipped = [t for t in shared if b[t] == "skipped"]
        shared = [t for t in shared if b[t] != "skipped"]
        print(f"{len(skipped)} tests the second report did not judge (skipped), left out")
    differ = [f"{t}: {a[t]} vs {b[t]}" for t in shared if a[t] != b[t]]
    for t in sorted(set(a) ^ set(b)):
        print(f"only in {'the first' if t in a else 'the second'} report: {t}")
    print(f"{len(shared)} tests in both reports, {len(differ)} with different verdicts")
    for line in differ:
        print("  " + line)
    return 1 if differ or not (shared or judged_only) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
