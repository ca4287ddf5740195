"""How the engine tier judges what an engine answered: the float64 oracle (``oracle``), the positions
agreement judges (``positions``), comparisons of two answers (``compare``) and of distributions
(``distribution``, against the calibrated ``thresholds``), prefix hits (``prefix_hits``), every
tolerance (``tolerances``), the repro scripts (``repro``), and ``judge``: the one place a verdict
records what it saw, writes its repro and fails."""
