"""The engine tier's conformance matrix (engine x version x family x property), as a table and a picture.

    python scripts/engine_matrix.py --engines infer_ref transformers vllm llama.cpp llama.cpp-float16 \
        llama.cpp-bfloat16 llama.cpp-server ctranslate2 onnxruntime-genai openvino --out DIR
                                                      run each engine's tier into DIR, then draw
    python scripts/engine_matrix.py --results DIR     draw from DIR/ENGINE.xml (and ENGINE.json)
    python scripts/engine_matrix.py REPORT.xml TITLE  one engine's property x checkpoint table

writing docs/engines-matrix.md and docs/engines-matrix.svg (``--md``, ``--svg``); the code is
``infer_ref.conformance.engines.matrix``.
"""

import sys

from infer_ref.conformance.engines.matrix.main import main

if __name__ == "__main__":
    sys.exit(main())
