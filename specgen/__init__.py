"""specgen: speculative kernel generation with parallel, isolated evaluation."""

__version__ = "0.1.0"
