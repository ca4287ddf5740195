"""``python -m infer_ref.cli``: the ``infer-ref`` command."""

import sys

from infer_ref.cli.main import main

sys.exit(main())
