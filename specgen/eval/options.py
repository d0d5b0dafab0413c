"""Settings of one evaluation: `EvalOptions` and the timing method it keys reference timings by.

`EvalOptions` travels from the worker to its runner subprocess inside the job frame, so it is
defined with every other cross-process message in `specgen.messages`; this module keeps the name
by which code outside the evaluation service imports it.
"""
from specgen.messages import TIMING_METHOD, EvalOptions

__all__ = ["EvalOptions", "TIMING_METHOD"]
