"""The ``infer-ref`` command line (``infer_ref.cli:main``, or ``python -m infer_ref.cli``).

``main`` builds one parser over the commands; ``options`` holds what they share (dtypes, devices,
model names, output paths, errors); ``generate`` / ``generate_engine`` are ``infer-ref generate``
with one prompt or several; ``golden/`` is ``infer-ref golden generate|verify|report``;
``conformance`` is ``infer-ref conformance``. Commands import ``options`` and the library, never
each other.
"""

from infer_ref.cli.main import main

__all__ = ["main"]
