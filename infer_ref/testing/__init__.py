"""The conformance kit: run infer_ref's property suite against any KV cache or decoder.

* :mod:`~infer_ref.testing.adapter` — the adapter protocol an implementation provides.
* :mod:`~infer_ref.testing.contract` — the cache contract (who advances, what ``update`` returns,
  windows, errors) and ``Unsupported``.
* :mod:`~infer_ref.testing.adapters` — infer_ref's own adapter (the default implementation).
* :mod:`~infer_ref.testing.adapters_transformers` — transformers' caches and models as adapters;
  their xfail files are in ``xfails/``.
* :mod:`~infer_ref.testing.conformance` — the conformance tests themselves (``infer-ref conformance``).
* :mod:`~infer_ref.testing.report` — the conformance report; :mod:`~infer_ref.testing.probes` —
  the mask read off ``attend``.
* :mod:`~infer_ref.testing.strategies` — bounded Hypothesis strategies.
* :mod:`~infer_ref.testing.assertions` — comparisons that report position, values, parameters, repro.
* :mod:`~infer_ref.testing.oracle` — expected values: transformers float64 and stated arithmetic.
* :mod:`~infer_ref.testing.plugin` — the pytest plugin (``--ir-impl``, ``--ir-device``, ``--ir-dtype``, ``--ir-xfails``, ``--ir-report``).
* :mod:`~infer_ref.testing.mutants` — planted bugs; ``python -m infer_ref.testing.mutants``.
* :mod:`~infer_ref.testing.synthetic` — random checkpoints in Hugging Face layout.

See docs/conformance.md for the step-by-step guide.
"""
