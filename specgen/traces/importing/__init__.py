"""Import of real reasoning: logs of a reasoning model become replayable specgen traces.

    specgen trace import FILE... --out DIR [--tokens-per-s R] [--tokenizer DIR] [--prompt FILE]
    specgen.traces.importing.import_traces(paths, out_dir, ...) -> [trace paths]

One trace file is written per conversation, with one iteration per turn: `<problem>.trace.json`
when the problem has one, else `<problem>.<sample>.trace.json` each (the sample field's value, or
the conversation's index in input order from 0). The inputs are what users already have; nothing
is annotated by hand, and imported traces hold no pre-written fork outputs (`forks` is empty:
forks are written at replay time by a fork model).

Accepted input (each file is detected by its content; several kinds may be given at once). Files
are UTF-8, with or without a byte-order mark, with LF or CRLF line ends:

1. Chat-completion responses, as one JSON document (an object or an array of them), as JSON Lines,
   or as JSON objects one after another. A record is any of
     - a response `{"model": ..., "choices": [{"message": {"reasoning_content": ..., "content": ...}}]}`
       (`reasoning` is read like `reasoning_content`), with the chat beside it in a top-level
       `"messages"` (or `"prompt"`) field when there is one;
     - `{"request": {"messages": [...], ...}, "response": {...}}` (also `"completion"` or `"output"`
       for the response, and the OpenAI batch shape, whose response and request sit in `"body"`);
     - a whole conversation `{"messages": [..., {"role": "assistant", "reasoning_content": ...,
       "content": ...}, ...]}`: every assistant message with reasoning is one turn, the messages
       before it its chat;
     - `{"messages": [...], "text": "<think>...</think>answer"}` (`"output"`, `"completion"` and
       `"response"` are read like `"text"` when they hold a string), and legacy completions whose
       `choices[0].text` holds the think tags.
   A message without `reasoning_content` whose content holds the think-end tag is split there.
2. Plain text: `<think>reasoning</think>answer` (the opening tag may be missing, as when the chat
   template opened it); a later `<think>` starts the next turn. The prompt comes from `--prompt`.
3. Streamed chunk logs (JSON Lines, or raw SSE `data: {...}` lines): OpenAI stream chunks
   `{"id": ..., "choices": [{"delta": {"reasoning_content": ..., "content": ...}}]}`, with their
   arrival time in a field `t` (also `time`, `arrival_time`, `arrival`, `timestamp`, `ts`: seconds,
   or an ISO-8601 time), either beside the chunk's fields or as `{"t": ..., "chunk": {...}}`
   (`"data"` works like `"chunk"`). A line without `choices` that carries `messages` or `request`
   opens a stream and gives its chat (its own time field, if any, is when the request was sent);
   a new chunk `id` also starts a new stream. Times are seconds since the request was sent; when
   they are absolute (epoch seconds or ISO) and no request time is logged, the first chunk is put
   `ttft_s` after the request. A chunk's own `created` counts as its arrival time only when it
   varies within a stream (OpenAI's is the request's second, the same for every chunk).

Naming the problem: an explicit `problem` / `problem_name` field (top level, or in `metadata`, or in
the request's `metadata`), else `--problem`; otherwise it is recovered from the prompt: the
`class Model` source the user messages embed (a fenced code block or raw text) is matched,
whitespace-normalized, against the bundled problems and `--problems` directories. A complete
embedded source (class Model, get_inputs, get_init_inputs) that matches none is written next to the
trace, and the trace names that problem, so it is still usable: as `<name>.py` when the record
names its problem without referring to a known one (a `name` / `problem_file` / `task_name` field,
top level or in `metadata`; `level1/19_ReLU.py` gives `level1_19_ReLU`), else `imported_<hash>.py`;
a name another program already has, or a record names explicitly, gets the hash too
(`<name>_<hash>`; `problems.py` has the rules). A problem found in a `--problems` directory is
copied next to the trace as well.

Records: each iteration of a trace keeps the input record it came from (`record`: the file, the
line, and the record's own id, `custom_id` or `id`, when it has one), and the CLI lists them beside
each trace it wrote.

Conversations: independent samples of a problem are traces of their own; a bench replays a trace's
turns as iterations with feedback between them, which independent samples never had. Turns are
one conversation when the input says so: the turns of one conversation record, or of one
plain-text file; records of a problem with the same `sample` / `sample_id` / `sample_index` /
`conversation_id` field (top level or `metadata`; then every record of the problem needs one);
records numbered by a turn field, each number once; or a record whose chat shows the last turn of
an earlier one: that turn's answer as an assistant message with a message after it (the feedback),
or a code block of that answer, new to its chat, quoted in the later prompt (a loop that starts
each iteration afresh, as specgen's own does). When turn numbers repeat without sample fields, a
later turn must show which conversation it continues.

Turn order: an explicit `turn` / `iteration` / `turn_index` field (top level or `metadata`) when every
turn of a conversation has one, else the order of the files and of the records in them.

Duplicates: a record with the same problem, chat, reasoning and answer as an earlier one (logged
twice, a file given twice) is imported once; records that repeat an earlier record's id
(`custom_id`, `id`) with other content are imported, and both are reported, a warning line per
kind with counts (`on_warning`; the CLI prints them after what it wrote).

Size: a record (a JSON value, the text of a stream, a plain-text turn) may hold `max_record_mb`
(`--max-record-mb`, default `MAX_RECORD_MB`) of text; importing costs some 200 times a turn's text
in memory. Files are read a block at a time, so a larger record stops the import before it is read
in full, with an error naming the file, the line and the record.

Timing: a stream with arrival times keeps its real token-time curve (`timing: "recorded"`). Any
other turn is timed at `tokens_per_s` (required then; `timing: "rate"`, `token_rate` the rate), the
first token `ttft_s` after the request. A problem's turns must all be timed the same way.

Tokenization: `tokenizer` (a local Hugging Face tokenizer directory) gives the model's own ids and
the trace names it; otherwise the trace carries a piece vocabulary built from its text (as
hand-written traces do), with the pieces joined to about `CHARS_PER_TOKEN` characters a token,
the density of real BPE tokenizers on reasoning, so token counts and rate timing look realistic.

The reasoning segment is the reasoning text exactly; the final segment is the think-end tag, a
blank line unless the answer begins with white space, and the answer (no answer: an empty final).

Errors (`TraceImportError`, a `UsageError`: one line, exit code 2 from the CLI) name the file, the
line and the field. Nothing is half-imported: everything is written to a temporary directory inside
the output directory and moved into place only when every input imported; on any error what this
call wrote is removed (and files it would replace are restored). So it is on SIGINT and SIGTERM:
during an import SIGTERM raises `ImportInterrupted` (the CLI exits 143, SIGINT 130), and signals
that come while the import undoes its writes, or once its files are in place, wait until it is done.

Modules, in the order an import runs through them: `records` reads each file's turns (`text`
the blocks and JSON values, `fields` a record's fields, `streams` chunk logs, `turns` what a turn
is); `problems` names each turn's problem; `conversations` drops duplicates and groups records
into traces; `tokens` turns text into timed chunks; `staging` writes them; `importer` runs it all.
"""
from specgen.traces.importing.importer import TraceImportWarning, import_traces, import_traces_detailed
from specgen.traces.importing.problems import embedded_sources
from specgen.traces.importing.staging import ImportedTrace, ImportInterrupted
from specgen.traces.importing.tokens import CHARS_PER_TOKEN
from specgen.traces.importing.turns import MAX_RECORD_MB, TraceImportError

__all__ = ["CHARS_PER_TOKEN", "MAX_RECORD_MB", "ImportInterrupted", "ImportedTrace", "TraceImportError",
           "TraceImportWarning", "embedded_sources", "import_traces", "import_traces_detailed"]
