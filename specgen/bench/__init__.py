"""`specgen bench`: the project's measured evidence, every mode side by side on the same traces.

It owns the bench's configuration (`config.py`), its two clocks (`virtual.py`, the default: every
distinct program of the traces evaluated once for real, then every mode simulated on those verdicts
and service times; `wall.py`: every mode run through the real loop on real time, the check of the
virtual one), the report with its ratios, intervals and plots (`report.py`), the ceilings of the
traces (`ceiling.py`); its command, with repeats and the sensitivity table, is `specgen/cli/bench.py`. It
drives the optimize loop and the simulator and sits above both; the problem entries it poses are
`optimize/bench_problems.py`, which `specgen simulate --replay-bench` poses again. See
docs/optimize.md, "Bench".
"""
