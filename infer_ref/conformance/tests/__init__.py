"""The conformance tests, shipped with the package (like onnx's backend tests).

Run them against any implementation with ``infer-ref conformance --impl module:ADAPTER`` or
``pytest --pyargs infer_ref.conformance.tests --ir-impl=module:ADAPTER``; docs/conformance.md
describes every capability and the report.
"""
