"""LLM engines the reasoner and forker talk to: vLLM in-process, OpenAI-compatible HTTP, replay."""
