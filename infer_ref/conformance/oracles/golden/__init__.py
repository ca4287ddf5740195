"""Golden token files: format, writing (from transformers) and teacher-forced verification.

A golden file freezes what transformers, the independent oracle, generates for a model: per
prompt, the greedy tokens and at every step the top-k token ids with their logprobs. It carries
the metadata needed to tell a bug from drift (model config fingerprint, weights digest, dtype,
device, versions, generator, prompt, sampling parameters), so that

* a file that does not describe the run (other weights, other config, other dtype or device
  type) fails with :class:`GoldenMetadataMismatch`, naming the fields, *before* anything is
  compared;
* a real disagreement fails with :class:`GoldenMismatch`: the step, the tokens, both top-k lists
  and the margin.

Verification is **teacher-forced** through the implementation's own KV cache: the prompt is fed
once, then at every step the *golden* token (never our own choice), so one early difference does
not derail every later step. A step passes when

1. the golden token's logprob is within ``eps`` of the implementation's best logprob (tie-aware:
   our argmax may differ when two tokens are within noise of each other), and
2. every golden top-k token's logprob is within ``topk_atol`` of the golden value, and no other
   token of our top-k beats the golden k-th logprob by more than ``topk_atol``.

The exact-match length of free-running greedy decoding is reported beside it: teacher forcing
and free running see the same inputs until the first step where our argmax differs from the
golden token, so it is the number of leading steps whose argmax equals the golden token.

Anything that can run a sequence through a cache can be verified: a :data:`SessionFactory` takes
a capacity and returns a :data:`StepFn` that appends token ids to its cache and returns the last
position's logits. Adapters exist for infer_ref (:func:`infer_ref_sessions`), transformers'
cached path (:func:`transformers_sessions`) and transformers without a cache
(:func:`transformers_uncached_sessions`, for measuring cached-vs-uncached noise).

Models are either checkpoint folders (the fixture checkpoints) or *synthetic*: a config plus a
seed, with weights drawn by :func:`synthetic_state_dict`, a counter-based generator that gives the
same bits on any CPU or GPU (splitmix64 hashes summed into an Irwin-Hall approximation of a
normal, scaled in float32). Regenerate golden files with ``infer-ref golden generate``; never
edit them by hand: each file records its counts and content digest, and a file that was edited,
truncated or merged is refused.

The package is split by concern: ``format`` (schema, integrity, reading and writing),
``tolerances``, ``errors``, ``sources`` (checkpoint or synthetic weights, loaded into either
implementation; the weight generator is :mod:`infer_ref.conformance.checkpoints.golden_models`),
``sessions``, ``implementations`` (each implementation's sessions on a file's model), ``writing``,
``verification``, ``results`` (the report and :class:`GoldenMismatch`)
and ``planted`` (known bugs, planted as the kit's mutants). Every public name is importable from
``infer_ref.conformance.oracles.golden``.
"""

from infer_ref.conformance.checkpoints.golden_models import (
    GENERATOR_DESCRIPTION,
    GENERATOR_NAME,
    SYNTHETIC_MODELS,
    PromptCase,
    SyntheticInit,
    SyntheticSpec,
    _noise_into,
    _tensor_key,
    synthetic_state_dict,
    weights_digest,
)
from infer_ref.conformance.oracles.golden.errors import GoldenError, GoldenFormatError, GoldenMetadataMismatch
from infer_ref.conformance.oracles.golden.format import (
    DEFAULT_TOP_K,
    DTYPES,
    FORMAT,
    FORMAT_VERSION,
    GOLDEN_DIR,
    REPO_ROOT,
    content_digest,
    dump_golden,
    load_golden,
    seal,
    validate,
)
from infer_ref.conformance.oracles.golden.implementations import IMPLEMENTATIONS, adapter_model, sessions_for
from infer_ref.conformance.oracles.golden.planted import PLANTED_BUGS, planted_bug
from infer_ref.conformance.oracles.golden.results import (
    CaseResult,
    GoldenMismatch,
    StepFailure,
    VerifyReport,
    format_failure,
    margin_percentiles,
)
from infer_ref.conformance.oracles.golden.sessions import (
    SessionFactory,
    StepFn,
    adapter_sessions,
    infer_ref_sessions,
    transformers_sessions,
    transformers_uncached_sessions,
)
from infer_ref.conformance.oracles.golden.sources import (
    ModelSource,
    load_infer_ref_model,
    load_transformers_model,
)
from infer_ref.conformance.oracles.golden.tolerances import TOLERANCES, Tolerance, tolerance_for
from infer_ref.conformance.oracles.golden.verification import (
    check_metadata,
    total_steps,
    verify,
    verify_case,
    verify_file,
)
from infer_ref.conformance.oracles.golden.writing import default_golden_path, device_name, write_golden

__all__ = [
    "DEFAULT_TOP_K",
    "DTYPES",
    "FORMAT",
    "FORMAT_VERSION",
    "GENERATOR_DESCRIPTION",
    "GENERATOR_NAME",
    "GOLDEN_DIR",
    "IMPLEMENTATIONS",
    "PLANTED_BUGS",
    "REPO_ROOT",
    "SYNTHETIC_MODELS",
    "TOLERANCES",
    "CaseResult",
    "GoldenError",
    "GoldenFormatError",
    "GoldenMetadataMismatch",
    "GoldenMismatch",
    "ModelSource",
    "PromptCase",
    "SessionFactory",
    "StepFailure",
    "StepFn",
    "SyntheticInit",
    "SyntheticSpec",
    "Tolerance",
    "VerifyReport",
    "_noise_into",
    "_tensor_key",
    "adapter_model",
    "adapter_sessions",
    "check_metadata",
    "content_digest",
    "default_golden_path",
    "device_name",
    "dump_golden",
    "format_failure",
    "infer_ref_sessions",
    "load_golden",
    "load_infer_ref_model",
    "load_transformers_model",
    "margin_percentiles",
    "planted_bug",
    "seal",
    "sessions_for",
    "synthetic_state_dict",
    "tolerance_for",
    "total_steps",
    "transformers_sessions",
    "transformers_uncached_sessions",
    "validate",
    "verify",
    "verify_case",
    "verify_file",
    "weights_digest",
    "write_golden",
]
