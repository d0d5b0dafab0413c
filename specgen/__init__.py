"""specgen: speculative kernel generation with parallel, isolated evaluation."""

__version__ = "0.1.0"


def __getattr__(name: str):  # imported on first use, so `import specgen` stays light
    if name == "Client":
        from specgen.runtime.client import Client

        return Client
    raise AttributeError(f"module 'specgen' has no attribute {name!r}")
