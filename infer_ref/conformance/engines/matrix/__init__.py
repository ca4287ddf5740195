"""The engine tier's conformance matrix: engine x version x family x property, from several engines'
JUnit XML and report JSON, as a Markdown table and an SVG picture (``scripts/engine_matrix.py``).

* :mod:`.results` reads one engine's results (outcomes per test and checkpoint, its version, the
  tolerances it was judged at); :mod:`.families` names a checkpoint's model family;
* :mod:`.grid` arranges them (property rows grouped by kind, engine x family columns, one cell each);
* :mod:`.markdown` and :mod:`.svg` draw the grid; :mod:`.run` runs the tier per engine first;
  :mod:`.main` is the command line.
"""
