"""Standalone repro scripts for engine-tier failures: the engine and transformers, nothing of infer_ref.

A failing agreement or self-consistency test writes one script per failure into the repro folder
(``$INFER_REF_REPRO_DIR``, default ``./engine-repros``) and names it in its message as
``repro: python FILE``. The script holds the requests as data, starts the engine with the same
settings through the engine's own API (the adapter's ``repro_snippet()``), runs each *schedule*
(which requests are sent together, in which order), compares every logprob with transformers'
float64 log-softmax at that position, compares the schedules with each other, prints each
disagreement and exits 1 when there is one — so an engine team can run it without infer_ref.

An adapter without ``repro_snippet()`` (a user's own factory, an endpoint) gets a script that starts
it through the kit's protocol instead (:func:`generic_snippet`: the factory imported by its
``module:FACTORY`` name and called with the same options, or the endpoint reached the same way):
it needs infer_ref beside the engine, where an adapter's own snippet needs only the engine. The
message also names the pytest command that reruns the test on the same engine, started the same way.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from infer_ref.conformance.engines.protocol import EngineHandle, EngineRequest

REPRO_DIR_ENV = "INFER_REF_REPRO_DIR"

_TEMPLATE = '''"""Repro: {test} -- {engine} on {model_dir}.

Found by infer_ref's engine tier: {summary}

Run: python {filename}    (needs {needs}, torch and transformers)
Exit status 1 and the disagreements printed while it still reproduces.
"""

import json
import sys

import torch
from transformers import AutoModelForCausalLM

MODEL_DIR = {model_dir!r}
TOLERANCE = {tolerance!r}  # nats: the engine tier's tolerance for this dtype
REQUESTS = json.loads({requests!r})
# Each schedule: groups of request indices, each group sent in one generate call, in this order.
SCHEDULES = {schedules!r}

{snippet}


def oracle_logprobs(model, tokens):
    """float64 log-softmax [T, V]: row i is the distribution of position i + 1."""
    with torch.inference_mode():
        logits = model(torch.tensor([tokens])).logits[0].double()
    return torch.log_softmax(logits, dim=-1)


def against_oracle(model, index, answer):
    request = REQUESTS[index]
    prompt = request["prompt"]
    rows = oracle_logprobs(model, prompt + answer["token_ids"])
    bad = 0
    for step, (token, logprob, top) in enumerate(answer["steps"]):
        row = rows[len(prompt) - 1 + step]
        for t, lp in [(token, logprob)] + [tuple(p) for p in top]:
            if not abs(lp - float(row[t])) <= TOLERANCE:
                print(f"request {{index}} step {{step}}: token {{t}} engine {{lp:.6f}} oracle {{float(row[t]):.6f}}")
                bad += 1
        if request["temperature"] == 0 and float(row[token]) < float(row.max()) - TOLERANCE:
            print(f"request {{index}} step {{step}}: chose {{token}}, the oracle's argmax {{int(row.argmax())}} scores higher")
            bad += 1
    return bad


def between_schedules(first, other, name):
    bad = 0
    for index in sorted(first):
        a, b = first[index], other[index]
        for step, (x, y) in enumerate(zip(a["steps"], b["steps"])):
            mine, theirs = dict(map(tuple, x[2])), dict(map(tuple, y[2]))
            mine[x[0]], theirs[y[0]] = x[1], y[1]
            for t in sorted(set(mine) & set(theirs)):
                if not abs(mine[t] - theirs[t]) <= TOLERANCE:
                    print(f"{{name}}: request {{index}} step {{step}}: token {{t}} {{mine[t]:.6f}} vs {{theirs[t]:.6f}}")
                    bad += 1
            if x[0] != y[0]:
                print(f"{{name}}: request {{index}} step {{step}}: tokens {{x[0]}} vs {{y[0]}}")
                bad += 1
                break
    return bad


def main():
    engine = start_engine()
    answers = []
    for schedule in SCHEDULES:
        got = {{}}
        for group in schedule:
            for index, answer in zip(group, run(engine, [REQUESTS[i] for i in group])):
                got[index] = answer
        answers.append(got)
    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=torch.float64, attn_implementation="eager").eval()
    bad = sum(against_oracle(model, i, a) for i, a in answers[0].items())
    bad += sum(between_schedules(answers[0], other, f"schedule {{k}}") for k, other in enumerate(answers[1:], 1))
    print(f"{{bad}} disagreement(s)")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
'''


@dataclass(frozen=True)
class EngineStart:
    """How the tier started an engine, for a script to start it the same way: ``factory``
    (``module:FACTORY``) called with ``options`` (``EngineOptions`` fields) and ``kwargs`` (the
    ``--engine-option`` keywords), or ``endpoint`` connected to."""

    factory: str | None = None
    options: dict[str, object] = field(default_factory=dict)
    kwargs: dict[str, object] = field(default_factory=dict)
    endpoint: str | None = None


_GENERIC = """# needs: infer_ref (the kit's engine protocol) and the engine's own package
import importlib
from pathlib import Path

from infer_ref.conformance.engines.protocol import EngineOptions, EngineRequest

FACTORY = {factory!r}
OPTIONS = {options!r}
ENGINE_KWARGS = {kwargs!r}
ENDPOINT = {endpoint!r}


def start_engine():
    torch.set_num_threads(1)
    if ENDPOINT:
        from infer_ref.conformance.engines.adapters.openai_http import connect

        return connect(ENDPOINT, Path(MODEL_DIR))
    module, _, name = FACTORY.partition(":")
    factory = getattr(importlib.import_module(module), name)
    return factory(Path(MODEL_DIR), EngineOptions(**OPTIONS), **ENGINE_KWARGS)


def run(engine, requests):
    asked = [EngineRequest(**{{**r, "prompt": tuple(r["prompt"]), "stop": tuple(r["stop"])}}) for r in requests]
    return [{{"token_ids": list(o.token_ids), "steps": [[e.token, e.logprob, [list(p) for p in e.top]] for e in o.logprobs]}}
            for o in engine.generate(asked)]
"""


def generic_snippet(start: EngineStart) -> str:
    """A repro script's ``start_engine`` and ``run`` for any factory or endpoint, through the protocol."""
    return _GENERIC.format(
        factory=start.factory, options=start.options, kwargs=start.kwargs, endpoint=start.endpoint
    )


def repro_dir() -> Path:
    return Path(os.environ.get(REPRO_DIR_ENV, "engine-repros"))


@dataclass(frozen=True)
class Case:
    """Where a verdict is given, and what its repro needs: the test, the checkpoint folder, the
    engine that answered, the pytest options that select that engine (``TierSettings.selects``),
    and how it was started (for the script of an engine without ``repro_snippet()``)."""

    test: str
    model_dir: Path
    handle: EngineHandle
    selects: str
    start: EngineStart | None = None

    @property
    def where(self) -> str:
        """``test[checkpoint]``: how the ledger names where a difference was seen."""
        return f"{self.test}[{self.model_dir.name}]"


@dataclass(frozen=True)
class Replay:
    """What a repro script sends and how it judges: ``requests``, each of ``schedules`` a list of
    groups of request indices sent together (a group runs after the one before it), compared at
    ``tolerance`` nats."""

    requests: Sequence[EngineRequest]
    schedules: Sequence[Sequence[Sequence[int]]]
    tolerance: float


def write_repro(case: Case, replay: Replay, summary: str) -> str:
    """Write the repro script of one failure; the ``repro:`` line(s) to put in the test's message.

    The pytest command that runs this test on this engine and checkpoint is always given; a script
    too where one can be written (the adapter's own snippet, else one through the protocol)."""
    test, model_dir, handle, selects, start = case.test, case.model_dir, case.handle, case.selects, case.start
    requests, schedules, tolerance = replay.requests, replay.schedules, replay.tolerance
    command = (
        f"repro: pytest --pyargs infer_ref.conformance.engines.tests -p no:xdist -k '{test}' {selects} "
        f"--ir-model-dir={shlex.quote(str(model_dir))}"
    )
    snippet_of = getattr(handle, "repro_snippet", None)
    own = snippet_of() if callable(snippet_of) else None
    through_protocol = start is not None and bool(start.factory or start.endpoint)
    snippet = own or (generic_snippet(start) if start is not None and through_protocol else None)
    if not snippet:
        return command
    folder = repro_dir()
    folder.mkdir(parents=True, exist_ok=True)
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{test}-{model_dir.name}")[:120] + ".py"
    path = folder / name
    needs, _, source = snippet.partition("\n")
    path.write_text(
        _TEMPLATE.format(
            test=test,
            engine=handle.name,
            model_dir=str(Path(model_dir).resolve()),
            summary=summary.splitlines()[0][:300],
            filename=path.name,
            needs=needs.removeprefix("# needs: "),
            tolerance=tolerance,
            requests=json.dumps([_request_dict(r) for r in requests]),
            schedules=[list(map(list, s)) for s in schedules],
            snippet=source.strip(),
        )
    )
    script = f"repro: python {path.resolve()}"
    return script if own else f"{command}\n{script}"  # the report quotes the last repro line: the script


def _request_dict(r: EngineRequest) -> dict[str, object]:
    out = asdict(r)
    out["prompt"], out["stop"] = list(r.prompt), list(r.stop)
    return out
