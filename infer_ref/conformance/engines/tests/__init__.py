"""The engine tier's properties: ``infer-ref conformance --engine ENGINE`` or ``--endpoint URL``."""
