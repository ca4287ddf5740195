"""The engines of one tier run: started on first use, once per checkpoint and kind of start, and
stopped at the end. It starts and stops engines and memoises what they answered; the options of
each start are the workload's (:mod:`~infer_ref.conformance.engines.workloads.geometry`), what the
run observed goes into the ledger (:mod:`~infer_ref.conformance.engines.ledger`), and the verdicts
are the tests' (:mod:`~infer_ref.conformance.engines.verdicts.judge`).

For an engine of text prompts the plain engine also answers each request once before any test
sends it (:meth:`EngineSession.judgeable`: can its answer be read back?), so the engine a test judges
sees each request first when the test sends it; an engine that refuses the plain start gets a third,
``probe``, start of the stressed options for that look.

An HTTP endpoint is one engine started by someone else: plain and stressed are then the same handle.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from infer_ref.conformance.engines.factory_options import EngineOptionError, parse_engine_options
from infer_ref.conformance.engines.ledger import Ledger
from infer_ref.conformance.engines.protocol import (
    CAPABILITIES,
    EngineHandle,
    EngineOptions,
    EngineOutput,
    EngineRequest,
)
from infer_ref.conformance.engines.recipes import LEGITIMATE
from infer_ref.conformance.engines.registry import ENGINES, known_engine
from infer_ref.conformance.engines.settings import DEFAULT_ENGINE, TierSettings
from infer_ref.conformance.engines.verdicts.repro import Case, EngineStart
from infer_ref.conformance.engines.workloads.geometry import options_for
from infer_ref.conformance.engines.workloads.prompts import ModelFacts, model_facts
from infer_ref.conformance.interface.contract import Unsupported
from infer_ref.errors import UsageError


class EngineStartError(UsageError):
    """An engine could not be started or reached; the message says what to do."""


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


def declared_recipe_differences(factory: object) -> dict[str, str]:
    """The legitimate low-precision recipes (:data:`~infer_ref.conformance.engines.recipes.LEGITIMATE`,
    by name) in which an engine differs from the canonical one, each with why
    (``factory.recipe_differences``; none declared: none). The recipe verdict names them beside the
    statistics they move, so a declared difference reads as a recipe difference of a measured size."""
    declared = dict(getattr(factory, "recipe_differences", None) or {})
    known = {recipe.name for recipe in LEGITIMATE}
    unknown = sorted(set(declared) - known)
    if unknown:
        raise EngineStartError(
            f"{getattr(factory, '__name__', factory)!r} declares recipe differences {', '.join(unknown)}: "
            f"expected names of legitimate recipes ({', '.join(sorted(known))})"
        )
    return declared


@dataclass
class EngineSession:
    """The engines of this run, started lazily and stopped at the end (:meth:`stop_all`)."""

    settings: TierSettings
    ledger: Ledger = field(default_factory=Ledger)
    factory: Callable[..., EngineHandle] | None = field(default=None, init=False)
    factory_kwargs: dict[str, object] = field(
        default_factory=dict, init=False
    )  # --engine-option, parsed and checked
    started: dict[tuple[str, str], EngineHandle] = field(default_factory=dict, init=False)
    failed: dict[tuple[str, str], str] = field(default_factory=dict, init=False)
    refused: dict[tuple[str, str], str] = field(
        default_factory=dict, init=False
    )  # starts declined (Unsupported)
    alone_answers: dict[tuple[str, EngineRequest], EngineOutput] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        settings = self.settings
        self._adopt_kept()
        if settings.endpoint is None:
            engine = settings.engine or DEFAULT_ENGINE
            self.factory = load_factory(engine)
            self.ledger.capabilities = declared_capabilities(self.factory)
            try:
                self.factory_kwargs = parse_engine_options(settings.engine_options, self.factory, engine)
            except EngineOptionError as e:
                raise EngineStartError(str(e)) from None
        elif settings.engine_options:
            raise EngineStartError(
                "--engine-option sets an engine the tier starts; a running endpoint was started by you"
            )
        try:
            settings.consistency  # noqa: B018 -- a given tolerance out of range is refused before any start
        except ValueError as e:
            raise EngineStartError(str(e)) from None

    def _adopt_kept(self) -> None:
        """The engines the command's pre-flight started for these very settings (:func:`keep_started`):
        this session's first starts, so that checking the engine before pytest costs no second start."""
        settings, started = _KEPT.pop("session", (None, {}))
        if settings == self.settings:
            self.started.update(started)
            self.ledger.engine_name = next((h.name for h in started.values()), self.ledger.engine_name)
        else:
            _stop(started)

    @property
    def name(self) -> str:
        return self.settings.name

    def kind_of(self, handle: EngineHandle) -> str:
        """Which start ``handle`` is (``stressed`` where it is none of this tier's: the tests' default)."""
        return next((kind for (_, kind), started in self.started.items() if started is handle), "stressed")

    def start_of(self, kind: str) -> EngineStart:
        """How the ``kind`` engine is started, for a repro script of an engine with no snippet of its own."""
        if self.settings.endpoint is not None:
            return EngineStart(endpoint=self.settings.endpoint)
        options = options_for(
            kind, self.settings.dtype, self.capabilities, long_context=self.settings.long_context
        )
        return EngineStart(
            factory=self.settings.factory_spec, options=asdict(options), kwargs=dict(self.factory_kwargs)
        )

    def case(self, test: str, model_dir: Path, handle: EngineHandle, kind: str = "stressed") -> Case:
        """Where a verdict is given, with what its repro needs: ``test`` on ``model_dir``, answered by
        ``handle`` (the ``kind`` start)."""
        return Case(test, model_dir, handle, self.settings.selects(), self.start_of(kind))

    @property
    def capabilities(self) -> frozenset[str]:
        """What the engine declares: its factory's (before any start), or a server's (it is running)."""
        if self.factory is not None:
            return declared_capabilities(self.factory)
        if self.settings.endpoint_model_dir is None:
            return frozenset(CAPABILITIES)
        try:
            return frozenset(self.handle(self.settings.endpoint_model_dir, "plain").capabilities)
        except EngineStartError:
            return frozenset(CAPABILITIES)  # every test then fails with the connect error, in one line

    def recipe_differences(self, model_dir: Path) -> dict[str, str]:
        """The legitimate recipes the engine declares it differs in (:func:`declared_recipe_differences`):
        its factory's, or a server's (read from its handle)."""
        if self.factory is not None:
            return declared_recipe_differences(self.factory)
        return declared_recipe_differences(self.handle(model_dir, "plain"))

    @property
    def ignore_eos(self) -> bool:
        """Whether requests may ask to generate past an end token (the engine declares ``ignore_eos``)."""
        return "ignore_eos" in self.capabilities

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
        if self.settings.endpoint is not None:
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
                self.ledger.engine_name = self.ledger.engine_name or self.started[key].name
                if self.ledger.capabilities is None and self.settings.endpoint is not None:
                    self.ledger.capabilities = frozenset(self.started[key].capabilities)
            except (
                Unsupported
            ) as e:  # the engine cannot run this kind of start: its tests are "not supported"
                self.refused[key] = f"{self.name} ({kind} start): {_one_line(e)}"
                raise Unsupported(self.refused[key]) from None
            except Exception as e:
                self.failed[key] = f"{self.name} could not start on {model_dir} ({kind}): {_one_line(e)}"
                raise EngineStartError(self.failed[key]) from None
        return self.started[key]

    def _start(self, model_dir: Path, kind: str) -> EngineHandle:
        if self.settings.endpoint is not None:
            from infer_ref.conformance.engines.adapters.openai_http import connect

            return connect(self.settings.endpoint, model_dir)
        assert self.factory is not None
        options = options_for(
            kind, self.settings.dtype, self.capabilities, long_context=self.settings.long_context
        )
        return self.factory(model_dir, options, **self.factory_kwargs)

    def alone(self, model_dir: Path, request: EngineRequest) -> EngineOutput:
        """``request`` run alone on the plain engine (memoised): the self-consistency reference."""
        key = (str(model_dir), request)
        if key not in self.alone_answers:
            [self.alone_answers[key]] = run(self.handle(model_dir, "plain"), [request])
        return self.alone_answers[key]

    def alone_answers_to(self, model_dir: Path, requests: Sequence[EngineRequest]) -> list[EngineOutput]:
        """Each of ``requests`` run alone on the plain engine (memoised)."""
        return [self.alone(model_dir, request) for request in requests]

    def judgeable(self, model_dir: Path, requests: Sequence[EngineRequest]) -> list[EngineRequest]:
        """``requests`` less those whose answers the engine cannot show exactly, for an engine of
        text prompts only; every request for any other engine.

        A text API answers token texts, not ids, and llama_cpp.server does not return the end token
        that stopped a request: an answer holding a token several tokens render to, or ended by
        an end token, cannot be mapped back to ids. Each request is first run alone on the plain
        engine (:meth:`_probe`), never on the engine the tests judge: the first send of a request
        to that engine is the judged one, on the cache state the test built. One whose answer
        raises ``Unsupported`` is left out, with its reason kept for the report's notes. None
        left: the test is "not supported" with the first reason.
        """
        if not self.takes_text_prompts(model_dir):
            return list(requests)
        looked = any((str(model_dir), r) not in self.ledger.unreadable for r in requests)
        kept = [r for r in requests if self.readable(model_dir, r)]
        if looked and self.settings.endpoint is not None:
            self._empty_server_cache(
                model_dir
            )  # one server plays every role: the test's first pass meets its cache cold
        if not kept:
            reasons = [self.ledger.unreadable[(str(model_dir), r)] for r in requests]
            first = reasons[0] if reasons else "no requests were given"
            raise Unsupported(
                f"none of the {len(requests)} requests has an answer {self.name} shows exactly ({first})"
            )
        return kept

    def readable(self, model_dir: Path, request: EngineRequest) -> bool:
        """Whether the engine's answer to ``request`` can be read back exactly (memoised; always for
        an engine of token prompts): :meth:`judgeable` for one request. On a server (``--endpoint``,
        one engine) the look is a send of its own, its cache left as the look left it."""
        if not self.takes_text_prompts(model_dir):
            return True
        key = (str(model_dir), request)
        if key not in self.ledger.unreadable:
            probe = self._probe(model_dir)  # a refused start is the test's "not supported", not a request's
            try:
                [answer] = run(probe, [request])
                self.ledger.unreadable[key] = None
                if probe is self.started.get((str(model_dir), "plain")) and self.settings.endpoint is None:
                    self.alone_answers.setdefault(key, answer)  # the very run alone() makes
            except Unsupported as e:
                self.ledger.unreadable[key] = _one_line(e)
        return self.ledger.unreadable[key] is None

    def _empty_server_cache(self, model_dir: Path) -> None:
        server = self.handle(model_dir, "plain")
        if "reset_prefix_cache" in server.capabilities:
            server.reset_prefix_cache()

    def _probe(self, model_dir: Path) -> EngineHandle:
        """Where :meth:`judgeable` runs requests: the plain start, an engine of its own with no prefix
        cache, so the engine a test judges sees each request first when the test sends it; for an
        engine that refuses (or fails) a plain start, a separate start of the stressed options
        (``probe``). A server (``--endpoint``) is one engine: its cache is emptied after the look instead."""
        try:
            return self.handle(model_dir, "plain")
        except (Unsupported, EngineStartError):
            return self.handle(model_dir, "probe")

    def not_continued(self, model_dir: Path, reasons: Sequence[str]) -> None:
        """Conversations of ``model_dir`` that could not be continued as text, each with its reason
        (for the report's notes: those requests were not judged)."""
        self.ledger.not_continued += [f"{model_dir.name}: {why}" for why in reasons]

    def stop_all(self) -> None:
        _stop(self.started)


def _stop(started: dict[tuple[str, str], EngineHandle]) -> None:
    for handle in started.values():
        with contextlib.suppress(Exception):  # stopping the others matters more than one complaint
            handle.stop()
    started.clear()


# The engines a pre-flight started (infer_ref.conformance.engines.preflight), with the settings they
# were started for, until the tier's session of the same process adopts them.
_KEPT: dict[str, tuple[TierSettings, dict[tuple[str, str], EngineHandle]]] = {}


def keep_started(session: EngineSession) -> None:
    """Keep ``session``'s started engines for the next :class:`EngineSession` of the same settings."""
    stop_kept()
    _KEPT["session"] = (session.settings, dict(session.started))
    session.started.clear()


def stop_kept() -> None:
    """Stop the engines a pre-flight kept that no session adopted (pytest selected no test that starts one)."""
    _stop(_KEPT.pop("session", (None, {}))[1])


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


class EngineCrash(Exception):
    """The engine raised while answering (anything but ``Unsupported`` or a lost connection): a
    failure of the test that sent ``requests``, which the tier's conftest gives a repro script."""

    def __init__(self, handle: EngineHandle, requests: Sequence[EngineRequest], error: Exception) -> None:
        super().__init__(
            f"{handle.name} raised while answering {len(requests)} request(s): {_one_line(error)}"
        )
        self.handle, self.requests, self.error = handle, list(requests), error


def run(handle: EngineHandle, requests: Sequence[EngineRequest]) -> list[EngineOutput]:
    """``handle.generate`` with the count checked (an engine dropping a request is a failure, not an
    index error) and a crash kept with the requests that caused it (:class:`EngineCrash`)."""
    try:
        outputs = handle.generate(list(requests))
    except (Unsupported, EngineStartError, AssertionError):
        raise
    except Exception as e:
        raise EngineCrash(handle, requests, e) from e
    if len(outputs) != len(requests):
        raise AssertionError(f"{len(requests)} requests sent, {len(outputs)} answers returned")
    return outputs
