"""The adapters the project ships: infer_ref's own (``reference``) and transformers' (``transformers``)."""
