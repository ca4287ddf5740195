"""Engine adapters: one module per engine, each a factory ``(model_dir, options) -> EngineHandle``."""
