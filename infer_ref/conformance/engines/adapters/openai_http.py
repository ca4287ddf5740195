"""Any OpenAI-compatible server by URL, as an engine of the tier (standard library HTTP only).

``connect(endpoint, model_dir)`` checks, before anything is judged, that the endpoint answers,
that it serves the folder's model (it accepts the folder's whole vocabulary, tokenizes text as the
folder's tokenizer does where it offers ``/tokenize``, and a greedy probe answers finite logprobs
of tokens in the vocabulary) and that logprobs come back: each failure is one line.

Requests go to ``/v1/completions`` with the prompt as token ids, one HTTP request per engine
request, sent together so that the server batches them. The answer's dialect is found by the
probe (:class:`Dialect`): vLLM's extras (tokens as ids, its own ``prompt_logprobs``, ``top_k``,
``ignore_eos``) where the server honours them, else the legacy ``echo`` for prompt logprobs and
token strings mapped back to ids through the folder's tokenizer. A server that takes prompts as
text only and tokenizes for its clients (``/extras/tokenize``: llama_cpp.server) is judged in the
text dialect (openai_text.py): a prompt goes out as text only where that text gives its ids back.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from infer_ref.conformance.engines.adapters.openai_client import EndpointError, HttpClient, ServerRefused
from infer_ref.conformance.engines.adapters.openai_engine import Dialect, OpenAIEngine
from infer_ref.conformance.engines.adapters.openai_text import (
    TOKENIZE_PATH,
    PromptText,
    RenderedTokens,
    server_tokenize,
)
from infer_ref.conformance.engines.adapters.openai_tokens import ID_PREFIX, TokenTable
from infer_ref.conformance.engines.protocol import EngineOptions, EngineRequest
from infer_ref.conformance.interface.contract import Unsupported

PROBE_LOGPROBS = 5
PROBE_TEXT = "The quick brown fox jumps over the lazy dog 0123456789."
VLLM_EXTRAS = {"return_tokens_as_token_ids": True}
# What any server that passes the probe can be asked; the rest depends on the dialect or on the
# options it was started with (known only for a server the kit launched).
BASE_CAPABILITIES = (
    "seed",
    "stop_strings",
    "batch",
    "top_logprobs",
)  # connect refuses a server without logprobs


def connect(
    endpoint: str,
    model_dir: Path,
    *,
    options: EngineOptions | None = None,
    timeout: float = 600.0,
    model: str | None = None,
) -> OpenAIEngine:
    """Check that ``endpoint`` serves ``model_dir``'s model with logprobs; return a handle on it.

    ``options``: what the server was started with, where known; they add the capabilities that
    depend on them (prefix caching, chunked prefill, a KV budget). ``model``: the served model's
    name, where the server serves several.
    """
    model_dir = Path(model_dir)
    client = HttpClient(endpoint, timeout)
    tokens = TokenTable(model_dir)
    served = served_model(client, model_dir, model)
    probe = EngineRequest(prompt=probe_prompt(tokens.vocab_size), max_tokens=2, logprobs=PROBE_LOGPROBS)
    answer, vllm_extras = _first_answer(client, served, probe)
    if answer is None:  # a server of text prompts only
        return _connect_text_only(client, served, model_dir, options)
    dialect = Dialect(
        vllm_extras=vllm_extras,
        prompt_logprobs=_prompt_logprobs_dialect(client, served, probe, answer),
        cached_tokens=isinstance((answer.get("usage") or {}).get("prompt_tokens_details"), dict),
    )
    engine = OpenAIEngine(client, served, tokens, dialect, frozenset(), name=_name(client))
    _check_probe_answer(engine, answer, probe)
    _check_whole_vocabulary(engine, tokens)
    _check_tokenizer(client, served, tokens, model_dir)
    engine.capabilities = _capabilities(client, dialect, options)
    return engine


def served_model(client: HttpClient, model_dir: Path, model: str | None) -> str:
    """The served model's name: ``model``, else the one whose name or root is the folder, else the only
    one."""
    listing = client.get("/models")
    try:
        entries = [(str(m["id"]), str(m.get("root") or "")) for m in listing["data"]]
    except (KeyError, TypeError):
        raise EndpointError(
            f"{client.endpoint}/models lists no models: is {client.endpoint} an OpenAI-compatible "
            "endpoint (…/v1)?"
        ) from None
    names = [name for name, _ in entries]
    if model is not None:
        if model not in names:
            raise EndpointError(f"{client.endpoint} serves {names}, not {model!r}")
        return model
    folder = str(model_dir.resolve())
    for name, root in entries:
        if folder in (name, root) or model_dir.name == name:
            return name
    if len(names) == 1:
        return names[0]
    raise EndpointError(f"{client.endpoint} serves {names}; none is {model_dir}: name the one to judge")


def probe_prompt(vocab_size: int) -> tuple[int, ...]:
    return tuple(min(i, vocab_size - 1) for i in (1, 2, 3, 4))


def _first_answer(
    client: HttpClient, served: str, probe: EngineRequest
) -> tuple[dict[str, Any] | None, bool]:
    """The probe's answer with vLLM's extras asked, or without them where the server refuses them;
    None from a server that takes text prompts and tokenizes text for its clients."""
    body = {
        "model": served,
        "prompt": list(probe.prompt),
        "max_tokens": probe.max_tokens,
        "temperature": 0.0,
        "logprobs": probe.logprobs,
    }
    try:
        answer = client.post("/completions", {**body, **VLLM_EXTRAS})
    except ServerRefused:
        try:
            answer = client.post("/completions", body)
        except ServerRefused as err:
            if _takes_text_only(client, served, err):
                return None, False
            raise EndpointError(
                f"{client.endpoint} refuses a plain /completions request with logprobs="
                f"{probe.logprobs} (HTTP {err.status}: {err.server_message}); a server must "
                "allow logprobs to be judged (vLLM: --max-logprobs 20)"
            ) from None
    tokens = ((answer.get("choices") or [{}])[0].get("logprobs") or {}).get("tokens") or []
    return answer, bool(tokens) and all(str(t).startswith(ID_PREFIX) for t in tokens)


def _takes_text_only(client: HttpClient, served: str, refusal: ServerRefused) -> bool:
    """Whether a server that refused a token-id prompt takes the same request with the prompt as text.

    Such a server is judged in the text dialect (openai_text.py) where it tokenizes text for its
    clients (``/extras/tokenize``): the tier's prompts are token ids, sent as text only where the
    server's tokenizer gives those ids back. Without that endpoint it cannot be judged.
    """
    try:
        client.post(
            "/completions",
            {"model": served, "prompt": "a", "max_tokens": 1, "temperature": 0.0, "logprobs": 1},
        )
    except (ServerRefused, EndpointError):
        return False
    if server_tokenize(client, served, "a") is None:
        raise Unsupported(
            f"{client.endpoint} takes prompts as text only (a token-id prompt: HTTP {refusal.status}: "
            f"{refusal.server_message[:160]}) and offers no {TOKENIZE_PATH} to check that a text "
            "gives the tier's token ids back; the tier judges on token ids"
        )
    return True


def _connect_text_only(
    client: HttpClient, served: str, model_dir: Path, options: EngineOptions | None
) -> OpenAIEngine:
    """The text dialect: the server's tokenizer must be the folder's; prompt logprobs are not asked."""
    tokens = RenderedTokens(model_dir)
    lead = server_tokenize(client, served, "") or []
    theirs = server_tokenize(client, served, PROBE_TEXT)
    if theirs != [*lead, *tokens.encode(PROBE_TEXT)]:
        raise EndpointError(
            f"{client.endpoint} tokenizes text differently from {model_dir}/tokenizer.json "
            f"({PROBE_TEXT!r}: {theirs}): it serves another model"
        )
    dialect = Dialect(vllm_extras=False, prompt_logprobs=None, cached_tokens=False, text_prompts=True)
    engine = OpenAIEngine(client, served, tokens, dialect, frozenset(), name=_name(client))
    engine.text_prompts = PromptText(
        model_dir, lambda text: server_tokenize(client, served, text), engine=client.endpoint, lead=lead
    )
    probe = EngineRequest(prompt=tuple(theirs), max_tokens=1, logprobs=PROBE_LOGPROBS)
    # echoed: the prompt's positions answer logprobs even where the model ends at once
    answer = client.post("/completions", {**engine.request_body(probe), "echo": True})
    legacy = answer["choices"][0].get("logprobs") or {}
    values = [v for top in legacy.get("top_logprobs") or [] for v in (top or {}).values()]
    if not values or not all(math.isfinite(v) and v <= 1e-6 for v in values):
        raise EndpointError(
            f"{client.endpoint} answered no finite log-probabilities ({values[:6]}): start it "
            "with logits for every position"
        )
    engine.capabilities = _capabilities(client, dialect, options) - {
        "batch"
    }  # it serves one request at a time
    return engine


def _prompt_logprobs_dialect(
    client: HttpClient, served: str, probe: EngineRequest, answer: dict[str, Any]
) -> str | None:
    """``vllm`` where the server answers its own ``prompt_logprobs``, else ``echo`` where that works."""
    body = {"model": served, "prompt": list(probe.prompt), "max_tokens": 1, "temperature": 0.0, "logprobs": 1}
    try:
        own = client.post("/completions", {**body, "prompt_logprobs": 1})
        positions = own["choices"][0].get("prompt_logprobs")
        if isinstance(positions, list) and len(positions) == len(probe.prompt):
            return "vllm"
        echoed = client.post("/completions", {**body, "echo": True})
        legacy = echoed["choices"][0].get("logprobs") or {}
        if len(legacy.get("tokens") or []) == len(probe.prompt) + 1:
            return "echo"
    except (ServerRefused, KeyError, IndexError, TypeError):
        pass
    return None


def _check_probe_answer(engine: OpenAIEngine, answer: dict[str, Any], probe: EngineRequest) -> None:
    output = engine.parse_answer(answer, probe)  # token texts to ids, each in the vocabulary
    values = [v for step in output.logprobs for v in (step.logprob, *(lp for _, lp in step.top))]
    if not all(math.isfinite(v) and v <= 1e-6 for v in values):
        raise EndpointError(
            f"{engine.client.endpoint} answered logprobs that are not finite log-probabilities "
            f"({values[:6]}...): it does not serve {engine.tokens.model_dir} as it is"
        )
    want = min(PROBE_LOGPROBS, engine.tokens.vocab_size)
    short = [len(step.top) for step in output.logprobs if len(step.top) < want]
    if short:
        raise EndpointError(
            f"{engine.client.endpoint} answered {short[0]} top logprobs where {want} were asked: "
            "start it allowing more (vLLM: --max-logprobs 20)"
        )


def _check_whole_vocabulary(engine: OpenAIEngine, tokens: TokenTable) -> None:
    """A server whose model has a smaller vocabulary refuses the folder's last token id."""
    last = EngineRequest(prompt=(1, tokens.vocab_size - 1), max_tokens=1, logprobs=1)
    try:
        engine.client.post("/completions", engine.request_body(last))
    except ServerRefused as err:
        raise EndpointError(
            f"{engine.client.endpoint} refuses token id {tokens.vocab_size - 1} of "
            f"{tokens.model_dir}'s vocabulary ({tokens.vocab_size} tokens): it serves another "
            f"model (HTTP {err.status}: {err.server_message})"
        ) from None


def _check_tokenizer(client: HttpClient, served: str, tokens: TokenTable, model_dir: Path) -> None:
    """Where the server offers ``/tokenize`` (vLLM does), it must split text as the folder does."""
    try:
        answer = client.post(
            "/tokenize", {"model": served, "prompt": PROBE_TEXT, "add_special_tokens": False}, root=True
        )
    except ServerRefused:
        return
    theirs = answer.get("tokens") if isinstance(answer, dict) else None
    if (
        theirs is not None
        and (model_dir / "tokenizer.json").is_file()
        and list(theirs) != tokens.encode(PROBE_TEXT)
    ):
        raise EndpointError(
            f"{client.endpoint} tokenizes text differently from {model_dir}/tokenizer.json: "
            "it serves another model"
        )


def _capabilities(client: HttpClient, dialect: Dialect, options: EngineOptions | None) -> frozenset[str]:
    found = set(BASE_CAPABILITIES)
    if dialect.prompt_logprobs:
        found.add("prompt_logprobs")
    if dialect.vllm_extras:
        found.update(("top_k_top_p", "ignore_eos"))
    if dialect.cached_tokens:
        found.add("cached_tokens")
    try:
        client.post("/reset_prefix_cache", None, root=True)  # vLLM offers it in its development mode
        found.add("reset_prefix_cache")
    except ServerRefused:
        pass
    if options is not None:
        found.update(("chunked_prefill", "kv_budget"))
        if options.prefix_caching:
            found.add("prefix_caching")
    return frozenset(found)


def _name(client: HttpClient) -> str:
    """``vllm 0.32.0 (server at URL)`` from the listing's owner and ``/version``, where offered."""
    try:
        owner = str(client.get("/models")["data"][0].get("owned_by") or "")
    except (EndpointError, KeyError, IndexError, TypeError, AttributeError):
        owner = ""
    try:
        version = str(client.get("/version", root=True)["version"])
    except (EndpointError, KeyError, TypeError):
        version = ""
    label = " ".join(part for part in (owner, version) if part) or "OpenAI-compatible server"
    return f"{label} (server at {client.endpoint})"
