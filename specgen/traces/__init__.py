"""Reasoning traces: the recorded-reasoning format and everything that makes or replays one.

- the format: `format.py` (a trace file, strict loading, `TraceBuilder`), `tokenizer.py` (the piece
  tokenizer whose vocabulary travels in the trace);
- replay as an engine: `replay.py` (recorded timing), `modelled.py` (a timing model's pace, forks
  from a fork writer), `pinned_replay.py` (the iteration the loop pins);
- making traces: `recorder.py` (from a live engine), `importing/` (from public reasoning logs,
  `specgen trace import`, its command in `specgen/cli/trace.py`), `synthetic.py` (the calibrated generator
  of `specgen bench --generate` and `tools/make_traces.py --generated`);
- serving them: `serve/` (recorded reasoning behind an OpenAI-compatible server, `specgen trace
  serve`);
- what traces are read against: `bundled.py` (the problems and traces that ship with specgen) and
  `extraction.py` (candidate programs found in generated text, as the loop finds them).

It sits above `engines` (a replay is an `Engine`) and below the loop in `optimize`, which replays
traces and extracts candidates through it.
"""
