"""LLM engines the reasoner and forker talk to: vLLM in-process, OpenAI-compatible HTTP, the timing
model that paces modelled replay, and the models tests run on (replay of traces: `specgen.traces`)."""
