"""Engine adapters: each module starts or connects to one kind of engine and returns an EngineHandle.

``vllm`` (vLLM offline, in its own venv through ``subprocess_bridge``), ``vllm_server`` (vLLM's
OpenAI-compatible server, launched by the kit) and ``openai_http`` (any OpenAI-compatible server
by URL).
"""
