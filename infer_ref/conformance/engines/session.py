"""The engines of one tier run: which engine, on which checkpoints, started how — each started once.

Per checkpoint the tier starts an engine at most twice (four times on the long-context workload):

* **plain**: prefix caching off, the whole prompt prefilled at once, an ample KV cache. Each request
  run *alone* on it gives the reference answers of the self-consistency properties.
* **stressed**: prefix caching on, a chunked-prefill budget of ``CHUNK_BUDGET`` tokens, and a KV
  budget of ``KV_BUDGET_BLOCKS`` blocks (smaller than a full batch needs, so a batch preempts),
  wherever the engine declares the capability. The agreement properties run on it.

The long-context tier (``--ir-long-context``, :mod:`~infer_ref.conformance.engines.workloads.long`)
starts the same two kinds at its own lengths (a chunk budget of 1000 tokens, a pool exactly as large
as its pool-edge pair), and ``block-1`` / ``block-16``: the stressed engine with KV blocks of 1 and
16 positions.

An HTTP endpoint is one engine started by someone else: plain and stressed are then the same handle.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shlex
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from infer_ref.conformance.engines.factory_options import EngineOptionError, parse_engine_options
from infer_ref.conformance.engines.notes import left_out_note
from infer_ref.conformance.engines.protocol import (
    CAPABILITIES,
    EngineHandle,
    EngineOptions,
    EngineOutput,
    EngineRequest,
)
from infer_ref.conformance.engines.registry import ENGINES, known_engine
from infer_ref.conformance.engines.verdicts.prefix_hits import PrefixHit
from infer_ref.conformance.engines.verdicts.repro import EngineStart
from infer_ref.conformance.engines.verdicts.tolerances import (
    ConsistencyTolerance,
    SpreadLog,
    consistency_tolerance,
)
from infer_ref.conformance.engines.workloads.long import (
    LONG_CHUNK_BUDGET,
    LONG_MAX_MODEL_LEN,
    PLAIN_LONG_KV_TOKENS,
    POOL_BLOCKS,
)
from infer_ref.conformance.engines.workloads.prompts import BLOCK_SIZE, ModelFacts, model_facts
from infer_ref.conformance.interface.contract import Unsupported
from infer_ref.errors import UsageError

CHECKPOINTS_ENV = "INFER_REF_ENGINE_CHECKPOINTS"
CHUNK_BUDGET = 64  # tokens per scheduler step: prompts of 65+ tokens prefill in chunks
KV_BUDGET_BLOCKS = 10  # fits the longest request (97 + 16 tokens: 4 blocks), not a batch of them
PLAIN_KV_TOKENS = 64 * BLOCK_SIZE
MAX_MODEL_LEN = 256  # the longest request is 97 + 16 tokens; a KV budget must hold one whole (vLLM checks)


def selection_options(engine: str | None, endpoint: str | None, dtype: str, engine_options: Sequence[str], *,
                      long_context: bool = False) -> list[str]:  # fmt: skip
    """The pytest options that select this engine, started the same way (and the workload): what a
    repro command needs beside the test and the checkpoint folder."""
    options = [f"--ir-endpoint={endpoint}" if endpoint else f"--ir-engine={engine or 'infer_ref'}"]
    if long_context:
        options.append("--ir-long-context")
    if dtype != "float32":
        options.append(f"--ir-engine-dtype={dtype}")
    return options + [f"--ir-engine-option={shlex.quote(o)}" for o in engine_options]


class EngineStartError(UsageError):
    """An engine could not be started or reached; the message says what to do."""


def default_model_dirs(progress: Callable[[str], None] | None = None, *, long_context: bool = False) -> list[Path]:
    """The kit's checkpoints: the three trained fixtures (from a checkout, or the wheel's data folder)
    and the engine checkpoints written from them on first use (in both config.json styles, under
    ``$INFER_REF_ENGINE_CHECKPOINTS``, default ``~/.cache/infer_ref/engine-checkpoints``; ``progress``
    hears a line per folder written). ``long_context``: the long-context checkpoints instead, in
    their one style. None without the fixtures."""
    from infer_ref.conformance.engines.workloads.checkpoints import FIXTURE_CHECKPOINTS, write_all
    from infer_ref.conformance.engines.workloads.long_checkpoints import LONG_CHECKPOINTS, LONG_STYLE

    if not FIXTURE_CHECKPOINTS.is_dir():
        return []
    if long_context:
        return write_all(engine_checkpoints_root(), progress, specs=LONG_CHECKPOINTS, styles=(LONG_STYLE,))
    fixtures = sorted(p for p in FIXTURE_CHECKPOINTS.iterdir() if (p / "config.json").is_file())
    return fixtures + write_all(engine_checkpoints_root(), progress)


def engine_checkpoints_root() -> Path:
    """Where the kit's engine checkpoints are written: ``$INFER_REF_ENGINE_CHECKPOINTS``, default
    ``~/.cache/infer_ref/engine-checkpoints``."""
    return Path(os.environ.get(CHECKPOINTS_ENV) or Path.home() / ".cache" / "infer_ref" / "engine-checkpoints")


def load_factory(spec: str) -> Callable[[Path, EngineOptions], EngineHandle]:
    """``vllm`` / ``infer_ref`` / ``transformers``, or ``module:FACTORY`` for a user's own engine."""
    if not known_engine(spec):
        raise EngineStartError(f"--engine {spec!r}: expected one of {', '.join(ENGINES)} or module:FACTORY")
    module_name, _, attr = ENGINES.get(spec, spec).partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise EngineStartError(f"--engine {spec!r}: cannot import {module_name} ({e})") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise EngineStartError(f"--engine {spec!r}: {module_name} has no callable {attr!r}")
    return factory


def declared_capabilities(factory: object) -> frozenset[str]:
    """What a factory declares before any start (``factory.capabilities``; none declared: all)."""
    caps = getattr(factory, "capabilities", None)
    return frozenset(CAPABILITIES) if caps is None else frozenset(caps)


@dataclass(frozen=True)
class Geometry:
    """The sizes a workload's starts use: the same rules (:func:`options_for`), other lengths."""

    max_model_len: int  # the longest request, prompt and generation
    plain_kv_tokens: int  # the plain start's ample KV cache
    chunk_budget: int  # the stressed start's tokens per step
    stressed_kv_tokens: int  # the stressed start's KV budget (the same tokens at every block size)


DEFAULT_GEOMETRY = Geometry(MAX_MODEL_LEN, PLAIN_KV_TOKENS, CHUNK_BUDGET, KV_BUDGET_BLOCKS * BLOCK_SIZE)
# Its pool is exactly the pool-edge pair's blocks: exhausted at a block boundary, at every block size.
LONG_GEOMETRY = Geometry(LONG_MAX_MODEL_LEN, PLAIN_LONG_KV_TOKENS, LONG_CHUNK_BUDGET, POOL_BLOCKS * BLOCK_SIZE)


def options_for(kind: str, dtype: str, capabilities: frozenset[str], *, long_context: bool = False) -> EngineOptions:
    """The options of a ``plain``, ``stressed`` or ``block-N`` (the stressed start with KV blocks of
    N positions) start at the workload's geometry, limited to what the engine can honour."""
    geometry = LONG_GEOMETRY if long_context else DEFAULT_GEOMETRY
    plain = EngineOptions(dtype=dtype, prefix_caching=False, block_size=BLOCK_SIZE,
                          kv_cache_tokens=geometry.plain_kv_tokens, max_model_len=geometry.max_model_len)  # fmt: skip
    if kind == "plain":
        return plain
    return replace(
        plain,
        prefix_caching="prefix_caching" in capabilities,
        block_size=int(kind.removeprefix("block-")) if kind.startswith("block-") else BLOCK_SIZE,
        max_num_batched_tokens=geometry.chunk_budget if "chunked_prefill" in capabilities else None,
        kv_cache_tokens=geometry.stressed_kv_tokens if "kv_budget" in capabilities else geometry.plain_kv_tokens,
    )


@dataclass
class EngineTier:
    """The engines of this run, started lazily and stopped at the end (:meth:`stop_all`)."""

    engine: str | None
    endpoint: str | None
    dtype: str
    endpoint_model_dir: Path | None = None  # the folder the endpoint serves
    consistency_given: float | None = None  # --ir-consistency-tolerance
    engine_options: tuple[str, ...] = ()  # --ir-engine-option KEY=VALUE: the factory's own keywords
    long_context: bool = False  # --ir-long-context: the long workload's starts (options_for)
    factory: Callable[..., EngineHandle] | None = None
    factory_kwargs: dict[str, object] = field(default_factory=dict)  # engine_options, parsed and checked
    started: dict[tuple[str, str], EngineHandle] = field(default_factory=dict)
    failed: dict[tuple[str, str], str] = field(default_factory=dict)
    refused: dict[tuple[str, str], str] = field(default_factory=dict)  # starts the engine declined (Unsupported)
    alone_answers: dict[tuple[str, EngineRequest], EngineOutput] = field(default_factory=dict)
    spreads: SpreadLog = field(default_factory=lambda: SpreadLog("between two schedules"))  # self-consistency
    distances: SpreadLog = field(default_factory=lambda: SpreadLog("from the oracle"))  # agreement
    consistency: ConsistencyTolerance = field(init=False)
    first_name: str | None = None  # the first started engine's name for itself (its version): the report notes it
    prefix_hits: list[PrefixHit] = field(default_factory=list)  # what the engine said its prefix cache served
    distributions: list[dict] = field(default_factory=list)  # low-precision verdicts: one summary per test and checkpoint
    # judgeable's memo: (checkpoint, request) -> why its answer cannot be read back, None where it can
    unreadable: dict[tuple[str, EngineRequest], str | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.endpoint is None:
            self.factory = load_factory(self.engine or "infer_ref")
            try:
                self.factory_kwargs = parse_engine_options(self.engine_options, self.factory, self.engine or "infer_ref")
            except EngineOptionError as e:
                raise EngineStartError(str(e)) from None
        elif self.engine_options:
            raise EngineStartError("--engine-option sets an engine the tier starts; a running endpoint was started by you")
        registered = None if self.endpoint else (self.engine or "infer_ref")
        try:
            self.consistency = consistency_tolerance(registered if registered in ENGINES else None, self.dtype, self.consistency_given,
                                                     long_context=self.long_context)  # fmt: skip
        except ValueError as e:
            raise EngineStartError(str(e)) from None

    @property
    def name(self) -> str:
        return f"endpoint {self.endpoint}" if self.endpoint else (self.engine or "infer_ref")

    def start_of(self, kind: str) -> EngineStart:
        """How the ``kind`` engine is started, for a repro script of an engine with no snippet of its own."""
        if self.endpoint is not None:
            return EngineStart(endpoint=self.endpoint)
        options = options_for(kind, self.dtype, self.capabilities, long_context=self.long_context)
        return EngineStart(factory=ENGINES.get(self.engine or "infer_ref", self.engine or "infer_ref"),
                           options=asdict(options), kwargs=dict(self.factory_kwargs))  # fmt: skip

    def selects(self) -> str:
        """The pytest options that select this engine, started the same way (a repro command's)."""
        return " ".join(selection_options(self.engine, self.endpoint, self.dtype, self.engine_options, long_context=self.long_context))

    @property
    def capabilities(self) -> frozenset[str]:
        """What the engine declares: its factory's (before any start), or a server's (it is running)."""
        if self.factory is not None:
            return declared_capabilities(self.factory)
        if self.endpoint_model_dir is None:
            return frozenset(CAPABILITIES)
        try:
            return frozenset(self.handle(self.endpoint_model_dir, "plain").capabilities)
        except EngineStartError:
            return frozenset(CAPABILITIES)  # every test then fails with the connect error, in one line

    def takes_text_prompts(self, model_dir: Path) -> bool:
        """Whether the engine takes prompts as text only: its factory's ``takes_text_prompts``
        (before any start), or a server's (the probe found out)."""
        if self.factory is not None:
            return bool(getattr(self.factory, "takes_text_prompts", False))
        try:
            return bool(getattr(self.handle(model_dir, "plain"), "takes_text_prompts", False))
        except (EngineStartError, Unsupported):
            return False  # the test that starts it fails (or is "not supported") with the reason

    def facts(self, model_dir: Path) -> ModelFacts:
        """What the workload is drawn from; text-stable prompts for an engine of text prompts only."""
        return model_facts(model_dir, text_prompts=self.takes_text_prompts(model_dir))

    def handle(self, model_dir: Path, kind: str) -> EngineHandle:
        """The started engine of ``kind`` on ``model_dir`` (started on first use)."""
        if self.endpoint is not None:
            kind = "plain"  # one server: both roles
        key = (str(model_dir), kind)
        if any(started != str(model_dir) for started, _ in self.started):
            self.stop_all()  # tests run checkpoint by checkpoint: only one checkpoint's engines are ever up
        if key in self.refused:
            raise Unsupported(self.refused[key])
        if key in self.failed:
            raise EngineStartError(self.failed[key])
        if key in self.started and not getattr(self.started[key], "alive", True):
            del self.started[key]  # it failed in an earlier test: the next one gets a fresh engine
        if key not in self.started:
            try:
                self.started[key] = self._start(model_dir, kind)
                self.first_name = self.first_name or self.started[key].name
            except Unsupported as e:  # the engine cannot run this kind of start: its tests are "not supported"
                self.refused[key] = f"{self.name} ({kind} start): {_one_line(e)}"
                raise Unsupported(self.refused[key]) from None
            except Exception as e:
                self.failed[key] = f"{self.name} could not start on {model_dir} ({kind}): {_one_line(e)}"
                raise EngineStartError(self.failed[key]) from None
        return self.started[key]

    def _start(self, model_dir: Path, kind: str) -> EngineHandle:
        if self.endpoint is not None:
            from infer_ref.conformance.engines.adapters.openai_http import connect

            return connect(self.endpoint, model_dir)
        assert self.factory is not None
        options = options_for(kind, self.dtype, self.capabilities, long_context=self.long_context)
        return self.factory(model_dir, options, **self.factory_kwargs)

    def alone(self, model_dir: Path, request: EngineRequest) -> EngineOutput:
        """``request`` run alone on the plain engine (memoised): the self-consistency reference."""
        key = (str(model_dir), request)
        if key not in self.alone_answers:
            [self.alone_answers[key]] = self.handle(model_dir, "plain").generate([request])
        return self.alone_answers[key]

    def judgeable(self, model_dir: Path, requests: Sequence[EngineRequest]) -> list[EngineRequest]:
        """``requests`` less those whose answers the engine cannot show exactly, for an engine of
        text prompts only; every request for any other engine.

        A text API answers token texts, not ids, and llama_cpp.server does not return the end token
        that stopped a request: an answer holding a token several tokens render to, or ended by
        an end token, cannot be mapped back to ids. Each request is first run alone on the
        stressed engine (the one the properties use; the answer is memoised); one whose answer
        raises ``Unsupported`` is left out, with its reason kept for the report's notes. None
        left: the test is "not supported" with the first reason.
        """
        if not self.takes_text_prompts(model_dir):
            return list(requests)
        handle = self.handle(model_dir, "stressed")  # a refused start is the test's "not supported", not a request's
        kept, reasons, ran = [], [], False
        for request in requests:
            key = (str(model_dir), request)
            if key not in self.unreadable:
                ran = True
                try:
                    run(handle, [request])
                    self.unreadable[key] = None
                except Unsupported as e:
                    self.unreadable[key] = _one_line(e)
            why = self.unreadable[key]
            if why is None:
                kept.append(request)
            else:
                reasons.append(why)
        if ran and "reset_prefix_cache" in handle.capabilities:
            handle.reset_prefix_cache()  # the test's first pass meets the cache cold, as it would have
        if not kept:
            first = reasons[0] if reasons else "no requests were given"
            raise Unsupported(f"none of the {len(requests)} requests has an answer {self.name} shows exactly ({first})")
        return kept

    @property
    def left_out(self) -> list[str]:
        """Why each request judgeable left out could not be read back (one entry per request)."""
        return [why for why in self.unreadable.values() if why is not None]

    def left_out_summary(self) -> str:
        """One note: how many requests were left out as unreadable, of how many, and why."""
        return left_out_note(self.name, self.left_out, len(self.unreadable))

    def stop_all(self) -> None:
        for handle in self.started.values():
            with contextlib.suppress(Exception):  # stopping the others matters more than one complaint
                handle.stop()
        self.started.clear()


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def run(handle: EngineHandle, requests: Sequence[EngineRequest]) -> list[EngineOutput]:
    """``handle.generate`` with the count checked (an engine dropping a request is a failure, not an index error)."""
    outputs = handle.generate(list(requests))
    if len(outputs) != len(requests):
        raise AssertionError(f"{len(requests)} requests sent, {len(outputs)} answers returned")
    return outputs
