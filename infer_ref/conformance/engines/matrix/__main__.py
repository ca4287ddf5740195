import sys

from infer_ref.conformance.engines.matrix.main import main

sys.exit(main())
