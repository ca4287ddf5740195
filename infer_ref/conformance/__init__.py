"""The conformance kit: run infer_ref's property suite against any KV cache or decoder.

* :mod:`~infer_ref.conformance.interface.adapter` — the adapter protocol an implementation provides.
* :mod:`~infer_ref.conformance.interface.contract` — the cache contract (who advances, what ``update`` returns,
  windows, errors) and ``Unsupported``.
* :mod:`~infer_ref.conformance.adapters.reference` — infer_ref's own adapter (the default implementation).
* :mod:`~infer_ref.conformance.adapters.transformers` — transformers' caches and models as adapters;
  their xfail files are in ``xfails/``.
* :mod:`~infer_ref.conformance.tests` — the conformance tests themselves (``infer-ref conformance``).
* :mod:`~infer_ref.conformance.report` — the conformance report; :mod:`~infer_ref.conformance.probes` —
  the mask read off ``attend``.
* :mod:`~infer_ref.conformance.strategies` — bounded Hypothesis strategies.
* :mod:`~infer_ref.conformance.assertions` — comparisons that report position, values, parameters, repro.
* :mod:`~infer_ref.conformance.oracles.definitions` — expected values: transformers float64 and stated arithmetic.
* :mod:`~infer_ref.conformance.plugin` — the pytest plugin (``--ir-impl``, ``--ir-device``, ``--ir-dtype``, ``--ir-xfails``, ``--ir-report``).
* :mod:`~infer_ref.conformance.mutants` — planted bugs; ``python -m infer_ref.conformance.mutants``.
* :mod:`~infer_ref.conformance.checkpoints.snapshots` — random checkpoints in Hugging Face layout.

See docs/conformance.md for the step-by-step guide.
"""
