"""Stand-alone worker scripts, run by an engine's own interpreter (its venv) under the subprocess bridge.

They import only the standard library, the engine and :mod:`worker_loop` (their sibling, found
through the script's folder): never infer_ref, which the engine's venv does not have.
"""
