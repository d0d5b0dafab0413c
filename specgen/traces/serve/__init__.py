"""`specgen trace serve`: recorded reasoning behind an OpenAI-compatible HTTP server.

The server answers what `vllm serve` answers for a reasoning model, from traces instead of a model,
so that everything which talks to a live server (the HTTP engine, forks, aborts, many jobs at once)
runs on realistic reasoning on any machine, a CI runner included:

- `GET /v1/models` lists one model (`--model`, default "specgen-trace");
- `POST /v1/completions` and `POST /v1/chat/completions`, streamed as server-sent events or not,
  with `token_ids` in each choice (`return_token_ids` / `return_tokens`, as vLLM and llama.cpp
  name it), `reasoning_content` deltas in chat, usage with `prompt_tokens_details.cached_tokens`
  (`stream_options.include_usage`); `max_tokens` (default: no limit), `stop`, `stop_token_ids`
  and `seed` are honoured, sampling settings are accepted and have no effect;
- `GET /stats`: requests running, the most at once, and how each kind ended (aborts included);
- a client that closes its connection aborts its request at once (the handler is cancelled
  while it waits for the next token), and every other request goes on.

**Tokens.** Prompts arrive as token ids of the client's tokenizer (or as text), so the server
holds that tokenizer (`--tokenizer DIR`, or the trace's own when it was recorded with a Hugging
Face tokenizer): prompts are decoded with it, and a trace's text is streamed as its ids. A trace whose
ids are another tokenizer's (the piece vocabulary of hand-written and generated traces) is
re-tokenized as a whole segment at a time, each token timed by the recorded chunk its last
character arrived in; the text streamed is the recorded text exactly.

**Which trace.** A request is matched to a problem first, then to a sample and a turn:

1. the problem: a `"problem"` field of the request naming a served problem; else the served
   problem whose source (its program, compared without whitespace, also without its docstring)
   the prompt embeds, the last found where several are. A trace's problem source is the
   `<problem>.py` beside the trace (what `specgen trace import` writes), else one in a
   `--problems` folder, else the bundled problem of that name, else the `class Model` program
   its recorded prompt embeds. No match is a 404 whose message names the served problems;
2. the sample, where several traces pose the problem: the request's `seed` modulo their number,
   else each reasoning request takes the next in turn;
3. the turn: the recorded turn whose user message the prompt holds (the longest); else the
   highest earlier turn number that specgen's own feedback names ("- iteration N, ...",
   "- Iteration N produced no ..."), so the N-th prompt of a job replays turn N; else the first.
   Past the last recorded turn, the last one again (the state the recording ended in).

**Reasoning or fork.** A completion prompt holding the trace's think-end tag is a fork: the
reasoning so far is the text before the last tag (the fork suffix of `optimize/fork_prompt.py`
starts with it), located in a recorded reasoning by the longest prefix the text ends with; a chat
whose last message is the assistant's is a fork, its reasoning so far the message's
`reasoning_content` (or its content before the tag). The fork is answered at the number of the
trace's reasoning tokens that prefix covers, as `ReplayEngine.fork` answers it: the trace's
recording there or the nearest earlier one (an empty answer before the first), with its recorded
timing. A trace without recorded forks (imported and generated ones), or every trace when the
server is given a fork model (`--fork-model draft|named`), has its forks written by the fork
writer instead (`optimize/fork_models.py`; the command passes it in). Anything else is a
reasoning request, answered with the turn's reasoning, the think-end tag and the final answer.

**Pace.** `recorded`: each token at its recorded time divided by `--speed` (a written fork answer,
which has none, after the timing model's time to first token, then at the turn's mean recorded
rate). `modelled`: as `ModelledEngine` paces it, every request at the timing model's
`decode_tps(n)` with n the requests decoding on this server at that moment, after a time to
first token that counts a fork's prompt as cached up to the last whole block before its suffix.

Modules: `timeline` holds the served tokenizer and what an answer streams; `library` the served
traces and the matching of a request to a problem, sample and turn; `wire` the OpenAI request and
response format; `pacing` when each token is due and how a request's limits cut the answer;
`server` the HTTP server that runs them.
"""
from specgen.traces.serve.library import ServedTrace, load_served_traces
from specgen.traces.serve.pacing import PACES
from specgen.traces.serve.server import DEFAULT_MODEL_NAME, TraceServer
from specgen.traces.serve.wire import Parsed, RequestError

__all__ = ["DEFAULT_MODEL_NAME", "PACES", "Parsed", "RequestError", "ServedTrace", "TraceServer",
           "load_served_traces"]
