"""The conformance kit: run infer_ref's property suite against any KV cache or decoder.

Layers, each importing only from the ones below it (no module imports upward, none in a circle):

* ``tests/`` — the conformance tests, one file per capability (``infer-ref conformance``).
* :mod:`~infer_ref.conformance.plugin` — the pytest plugin (``--ir-impl``, ``--ir-device``,
  ``--ir-dtype``, ``--ir-xfails``, ``--ir-report``); :mod:`~infer_ref.conformance.profiles` — the
  Hypothesis profiles.
* :mod:`~infer_ref.conformance.report` — the conformance report (per capability, bug class, oracle;
  the verdict, precision notes, refusals); :mod:`~infer_ref.conformance.precision_spread` — the
  measurement behind the float64 tolerances.
* ``mutants/`` — planted bugs, each a complete adapter whose instances carry it; nothing global is
  patched (``python -m infer_ref.conformance.mutants``).
* :mod:`~infer_ref.conformance.case_models` (drawn model cases -> models of the implementation
  under test) and :mod:`~infer_ref.conformance.probes` (the mask read off ``attend``).
* :mod:`~infer_ref.conformance.strategies` — bounded Hypothesis strategies;
  :mod:`~infer_ref.conformance.assertions` — comparisons that report position, values, parameters, repro.
* ``adapters/`` — the adapters the project ships: infer_ref's own (``reference``, the default
  implementation) and transformers' (``transformers``; their expected failures in ``xfails/``).
* ``oracles/`` — expected values: stated arithmetic (``definitions``, ``gemv``, ``paged``,
  ``allocator``), transformers in float64 (``transformers_fp64`` with its float32 casts lifted by
  ``float64_definition``, ``teacher_forced``) and golden
  files (``golden/``: format, writing, verification, tolerances, sources, sessions, results, planted).
* :mod:`~infer_ref.conformance.tiers` — the float64 verdicts (exact / float32 intermediates / wrong)
  and their tolerances.
* ``interface/`` — what an implementation provides: the adapter protocol (``adapter``) and the cache
  contract (``contract``: who advances, what ``update`` returns, windows, errors, ``Unsupported``).
* ``checkpoints/`` — weights made up for tests: seeded random Hugging Face snapshots of tiny and
  real-shape configs (``snapshots``) and the golden files' synthetic models (``golden_models``).

See docs/conformance.md for the step-by-step guide.
"""
