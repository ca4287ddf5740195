"""``infer-ref conformance``: run the shipped conformance tests against an adapter, from anywhere.

    infer-ref conformance --impl my_engine.adapter:ADAPTER [--device cuda] [--dtype bfloat16]
                          [--xfails FILE] [-n auto] [--report report.md|json] [-- PYTEST ARGS]

is ``pytest --pyargs infer_ref.conformance.tests --ir-impl=...`` with the options spelled out;
everything after ``--`` (or any option it does not know that pytest takes) goes to pytest unchanged;
an option neither takes is refused before pytest starts. The exit status is the command's own
(docs/errors.md): 0 conforms, 1 does not conform, 2 usage error, 5 a named file is missing,
7 nothing (or not everything) judged, 70 pytest broke; ``conformance_exit_status`` maps pytest's.

    infer-ref conformance --engine vllm|infer_ref|transformers|module:FACTORY [--model-dir DIR] [--dtype float32]
    infer-ref conformance --endpoint http://127.0.0.1:PORT/v1 --model-dir DIR

run the engine tier instead (``infer_ref.conformance.engines.tests``): an engine judged through its
generate API, started by the tier on each checkpoint folder (default: the kit's checkpoints), or
a running OpenAI-compatible server serving ``DIR``.
"""

from __future__ import annotations

import argparse
import importlib.util
from collections.abc import Sequence
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING

from infer_ref.cli.options import (
    DTYPES,
    FIXTURES,
    UsageError,
    check_device,
    check_output_paths,
    check_user_adapter,
    user_object,
)
from infer_ref.conformance.engines import preflight
from infer_ref.conformance.engines.registry import BY_NAME, ENGINES, known_engine
from infer_ref.errors import (
    EXIT_FAILED_CHECK,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_NOT_JUDGED,
    EXIT_OK,
    EXIT_USAGE,
)
from infer_ref.paths import require_config

if TYPE_CHECKING:
    from infer_ref.conformance.engines.settings import TierSettings

PLUGIN = "infer_ref.conformance.plugin"
DEFAULT_IMPL = "infer_ref.conformance.adapters.reference:INFER_REF"
ADAPTER_CLASS = "infer_ref.conformance.interface.adapter.Adapter"
ENGINE_FACTORY = "a callable start(model_dir, options) -> handle (docs/adapters.md)"


def add_conformance_command(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "conformance",
        help="run the conformance tests against an implementation (an infer_ref.conformance.interface.adapter.Adapter)",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    p.add_argument("--impl", default=DEFAULT_IMPL, metavar="MODULE:OBJECT",
                   help="the adapter under test (default: infer_ref itself)")
    p.add_argument("--device", default="cpu", help="device every adapter call receives (cpu, cuda, cuda:N; default cpu)")
    p.add_argument("--dtype", default=None, choices=list(DTYPES),
                   help="model / attention dtype: float64 is the exact tier (default); bfloat16/float16 use the golden "
                        "tolerances. With --engine: the engine's dtype (default float32)")
    p.add_argument("--engine", default=None, metavar="ENGINE",
                   help="engine tier: judge an engine through its generate API (vllm, vllm-server, llama.cpp, llama.cpp-server, ctranslate2, onnxruntime-genai, openvino, infer_ref, transformers, transformers-cb, module:FACTORY)")
    p.add_argument("--endpoint", default=None, metavar="URL",
                   help="engine tier: judge a running OpenAI-compatible server (http://127.0.0.1:PORT/v1); needs --model-dir")
    p.add_argument("--model-dir", action="append", default=None, metavar="DIR",
                   help="engine tier: checkpoint folder(s) to judge on (default: the kit's checkpoints)")
    p.add_argument("--engine-option", action="append", default=None, metavar="KEY=VALUE",
                   help="engine tier: a keyword of the engine's factory, e.g. kv_cache_type=float16 for llama.cpp (repeatable)")
    p.add_argument("--long-context", action="store_true",
                   help="engine tier: the long-context workload instead of the default one: prompts to 8193 positions "
                        "crossing windows of 512/1024, Llama 3's RoPE threshold 8192 and block boundaries, on the kit's "
                        "long checkpoints (or --model-dir); 3 to 5 minutes an engine on 2 cores, text-prompt engines included")
    p.add_argument("--tracebacks", action="store_true",
                   help="engine tier: print pytest's tracebacks of the failures (default: each failure in a line, the "
                        "likely bug class and one repro command)")
    p.add_argument("--consistency-tolerance", type=float, default=None, metavar="NATS",
                   help="engine tier: self-consistency tolerance for an engine the kit has not measured (default: the oracle's)")
    p.add_argument("--xfails", action="append", default=None, metavar="FILE",
                   help="expected failures, one test-id prefix per line (repeatable)")
    p.add_argument("-n", "--numprocesses", default=None, metavar="N|auto",
                   help="pytest-xdist workers; with --device cuda each worker takes its own GPU")
    p.add_argument("--report", default=None, metavar="FILE", help="write the conformance report (.md or .json)")
    p.add_argument("--strict-float64", action="store_true",
                   help="float64: fail logits that reach only 'float64 with float32 intermediates' (default: a precision note)")
    p.add_argument("--profile", default=None, help="Hypothesis profile: dev, ci, nightly (default: ci when CI=true, else dev)")
    p.add_argument("-k", dest="keyword", default=None, help="only tests matching this pytest -k expression")
    p.set_defaults(run=run_conformance, pass_through=True)


def pytest_args(args: argparse.Namespace, extra: Sequence[str]) -> list[str]:
    """The pytest command line for ``args`` (plus ``extra``, passed through)."""
    if args.engine or args.endpoint:
        out = ["--pyargs", "infer_ref.conformance.engines.tests", f"--ir-engine-dtype={args.dtype or 'float32'}"]
        out += [f"--ir-engine={args.engine}"] if args.engine else [f"--ir-endpoint={args.endpoint}"]
        out += [f"--ir-model-dir={d}" for d in args.model_dir or []]
        out += [f"--ir-engine-option={o}" for o in args.engine_option or []]
        out += ["--ir-long-context"] if args.long_context else []
        if args.consistency_tolerance is not None:
            out += [f"--ir-consistency-tolerance={args.consistency_tolerance!r}"]
        out += ["--ir-tracebacks"] if args.tracebacks else []
    else:
        out = ["--pyargs", "infer_ref.conformance.tests", f"--ir-impl={args.impl}", f"--ir-device={args.device}",
               f"--ir-dtype={args.dtype or 'float64'}"]
    # The engine tier's report lists each failure with what differed: pytest's FAILED lines would repeat them.
    engine_tier = bool(args.engine or args.endpoint)
    out += ["-p", "no:cacheprovider", "-rEsxX" if engine_tier and not args.tracebacks else "-rfEsxX",
            "-W", "ignore::pytest.PytestAssertRewriteWarning"]  # the command itself imported infer_ref first
    out += ["-p", "no:benchmark"]  # the kit times nothing: pytest-benchmark's "defaults" header line is noise here
    # A plain checkout on PYTHONPATH has no entry point; an install made before the kit moved names
    # the plugin by its old path, which loads the same module: adding it again would register it twice.
    if not any(ep.name == "infer_ref" for ep in entry_points(group="pytest11")):
        out[:0] = ["-p", PLUGIN]
    out += [f"--ir-xfails={f}" for f in args.xfails or []]
    if args.report:
        out.append(f"--ir-report={args.report}")
    if args.strict_float64:
        out.append("--ir-strict-float64")
    if args.profile:
        out.append(f"--hypothesis-profile={args.profile}")
    if args.keyword:
        out += ["-k", args.keyword]
    if args.numprocesses:
        out += ["-n", str(args.numprocesses)]
    return out + [a for a in extra if a != "--"]


def check_engine_args(args: argparse.Namespace) -> None:
    """Refuse engine-tier options that cannot work together, before pytest starts."""
    if args.engine and args.endpoint:
        raise UsageError("--engine starts an engine, --endpoint judges a running one: give one of them")
    if args.endpoint and not args.model_dir:
        raise UsageError("--endpoint needs --model-dir DIR: the folder the server serves (the oracle reads it)")
    if args.tracebacks and not (args.engine or args.endpoint):
        raise UsageError("--tracebacks belongs to the engine tier (the adapter tier prints them always): add --engine "
                         "ENGINE or --endpoint URL")
    if args.engine_option and not args.engine:
        raise UsageError("--engine-option sets a keyword of an engine the tier starts: add --engine ENGINE")
    if args.long_context and not (args.engine or args.endpoint):
        raise UsageError("--long-context is a workload of the engine tier: add --engine ENGINE or --endpoint URL")
    if args.model_dir and not (args.engine or args.endpoint):
        raise UsageError("--model-dir belongs to the engine tier: add --engine ENGINE or --endpoint URL")
    if args.engine and not args.model_dir and not FIXTURES.is_dir():
        raise UsageError(f"--engine {args.engine} without --model-dir judges the kit's own checkpoints, which need a "
                         f"checkout of infer_ref or its wheel ({FIXTURES} is not there): pass --model-dir DIR, a Hugging Face "
                         "checkpoint folder")
    if (args.engine or args.endpoint) and args.impl != DEFAULT_IMPL:
        raise UsageError("--impl judges an in-process adapter; the engine tier takes --engine or --endpoint instead")


def check_names_and_files(args: argparse.Namespace) -> None:
    """Refuse what pytest would only refuse after starting: an unknown engine, a missing xfails file,
    a checkpoint folder that is not there, a report path that cannot be written."""
    if args.engine and not known_engine(args.engine):
        raise UsageError(f"--engine {args.engine!r}: expected one of {', '.join(ENGINES)} or module:FACTORY")
    for folder in args.model_dir or []:
        require_config(Path(folder), "--model-dir")  # the weights may be any format the engine reads
    for path in args.xfails or []:
        if not Path(path).is_file():
            raise FileNotFoundError(f"--xfails {path}: no such file (expected one test-id prefix per line)")
    check_output_paths(args.report)


def check_user_modules(args: argparse.Namespace) -> None:
    """The user's ``--impl`` / ``--engine module:FACTORY`` imported before pytest starts (from the
    working directory too): a missing module or object is this command's one line, not pytest's."""
    if args.impl != DEFAULT_IMPL:
        check_user_adapter(args.impl, "--impl", f"an {ADAPTER_CLASS} or a callable returning one, e.g. {DEFAULT_IMPL}")
    if args.engine and args.engine not in ENGINES:
        factory = user_object(args.engine, "--engine", ENGINE_FACTORY, kind="FACTORY")
        if not callable(factory):
            raise UsageError(f"--engine {args.engine!r} is a {type(factory).__name__}, expected {ENGINE_FACTORY}")


def check_pytest_options(extra: Sequence[str]) -> None:
    """Options this command does not know go to pytest; those given before ``--`` are checked
    against pytest's own and its plugins' options here, so a typo is one line at once rather than
    pytest's refusal once infer_ref's plugin (torch) has loaded. Skipped where ``-p`` loads another
    plugin, or where pytest's parser cannot be read: pytest then decides, as it always did."""
    before = list(extra[: list(extra).index("--")] if "--" in extra else extra)
    given = [a for a in before if a.startswith("-") and not a.startswith("--ir-")]
    if not given or any(a.startswith("-p") for a in given):
        return
    known = _pytest_option_names()
    for arg in given:
        name = arg.split("=", 1)[0] if arg.startswith("--") else arg[:2]
        if known is not None and name not in known:
            raise UsageError(f"unknown option {arg}: neither infer-ref conformance nor pytest takes it "
                             "(see infer-ref conformance --help; options meant for pytest alone go after --)")


def _pytest_option_names() -> set[str] | None:
    """Every option string pytest accepts with its built-in plugins and the installed ones, infer_ref's
    excepted (its ``--ir-*`` options are this command's); None when pytest's parser cannot be read."""
    try:
        from _pytest.config import get_config

        config = get_config()
        for ep in entry_points(group="pytest11"):
            if ep.name != "infer_ref":
                config.pluginmanager.register(ep.load(), ep.name)
        parser = config._parser
        return {name for group in (parser._anonymous, *parser._groups) for option in group.options for name in option.names()}
    except Exception:  # a pytest whose internals moved: let pytest itself judge the options
        return None


def run_conformance(args: argparse.Namespace, extra: Sequence[str] = ()) -> int:
    check_engine_args(args)  # arguments alone, then the files they name, then what needs an import
    check_names_and_files(args)
    check_pytest_options(extra)
    if not (args.engine or args.endpoint):
        check_device(args.device)
    if args.numprocesses and importlib.util.find_spec("xdist") is None:
        raise UsageError("-n needs pytest-xdist: pip install pytest-xdist")
    check_user_modules(args)
    if args.endpoint:  # an engine that cannot be reached or started: one line, exit 7 (docs/errors.md)
        preflight.check_reachable(args.endpoint)
    if args.engine:
        preflight.check_installed(args.engine)
    import pytest

    from infer_ref.conformance.engines.session import stop_kept

    if args.engine or args.endpoint:
        model_dirs = [Path(d) for d in args.model_dir] if args.model_dir else _write_engine_checkpoints(args.long_context)
        if _starts_here(args):
            preflight.start_first(_tier_settings(args), model_dirs)
    try:
        return conformance_exit_status(int(pytest.main(pytest_args(args, extra))))
    finally:
        stop_kept()


def _starts_here(args: argparse.Namespace) -> bool:
    """Whether the pre-flight starts the engine: one that runs in this Python (infer_ref, transformers,
    a user's factory), in a run without xdist workers (each of which starts its own)."""
    record = BY_NAME.get(args.engine)
    return bool(args.engine) and not args.numprocesses and (record is None or record.python_env is None)


def _tier_settings(args: argparse.Namespace) -> TierSettings:
    """The engine tier's settings that :func:`pytest_args` selects (the pre-flight starts that engine)."""
    from infer_ref.conformance.engines.settings import TierSettings

    return TierSettings(
        engine=args.engine,
        endpoint=args.endpoint,
        dtype=args.dtype or "float32",
        model_dirs=tuple(Path(d) for d in args.model_dir or ()),
        consistency_given=args.consistency_tolerance,
        engine_options=tuple(args.engine_option or ()),
        long_context=bool(args.long_context),
    )


def _write_engine_checkpoints(long_context: bool) -> list[Path]:
    """The kit's engine checkpoints, written on first use before pytest starts (so the progress
    lines reach the terminal, not pytest's capture); a later run finds them cached."""
    import sys

    from infer_ref.conformance.engines.workloads.folders import default_model_dirs

    return list(default_model_dirs(progress=lambda line: print(line, file=sys.stderr, flush=True), long_context=long_context))


# pytest's exit codes -> the command's (docs/errors.md). The report plugin already turns a run with no
# failure but tests not judged into 7; pytest's own "no tests collected" is nothing judged as well.
_FROM_PYTEST = {0: EXIT_OK, 1: EXIT_FAILED_CHECK, 2: EXIT_INTERRUPTED, 3: EXIT_INTERNAL, 4: EXIT_USAGE,
                5: EXIT_NOT_JUDGED, EXIT_NOT_JUDGED: EXIT_NOT_JUDGED}  # fmt: skip


def conformance_exit_status(pytest_status: int) -> int:
    """The command's exit status for pytest's (an unknown one is passed on unchanged)."""
    return _FROM_PYTEST.get(pytest_status, pytest_status)
