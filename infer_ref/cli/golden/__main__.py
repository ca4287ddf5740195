"""``python -m infer_ref.cli.golden generate|verify|report ...``."""

import os
import sys

from infer_ref.cli.golden import main

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.exit(main())
