"""What a client's job may name for its engine on the scheduler's host: the setting `engine_sources`.

A job's `options["engine"]` (optimize/engine_kinds.py) names things its reasoner opens on the
scheduler's host: a model or tokenizer directory, a trace file, the base URL of a server it
fetches. Any client may create jobs, so, as `job_entries` does for entries, the scheduler takes
such a name from a plain client only if its settings allow it: by its allowed name, or by the exact
allowed value (`refusal`). The check compares strings only, before anything is opened or fetched,
and its refusal names the field, never the value: a path that exists and one that does not are
refused with the same words. A field the check does not know is refused too, so an engine added
later names nothing on the host until its fields are listed here. The cluster's admin (the
operator: the cluster `specgen optimize` starts for itself, `Client(join_secret=...)`) is trusted
and not checked.

The job's reasoner turns allowed names into their values (`resolve`) and, in what it reports,
turns the values that are host paths or URLs back into their names (`Redactor`), so that an error
a client reads does not show where things are on the host.
"""
from __future__ import annotations

import os
from pathlib import PurePath
from typing import Any

import msgspec

# The job option that holds the engine's spec (the optimize loop's, optimize/job.py).
ENGINE_OPTION = "engine"


class EngineSources(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What a plain client's job may name, each as `{name: value}`; a client gives the name or the
    exact value. Values are as the engine takes them: absolute paths on the scheduler's host."""

    models: dict[str, str] = {}             # a model directory (vllm) or a served model's name (openai)
    tokenizers: dict[str, str] = {}         # a tokenizer directory
    base_urls: dict[str, str] = {}          # an OpenAI-compatible server's URL
    traces: dict[str, str] = {}             # a trace file (the package's own traces need no entry)


# Engine fields that name something on the scheduler's host, and the list that allows them.
HOST_FIELDS = {"model": "models", "tokenizer": "tokenizers", "base_url": "base_urls", "trace": "traces"}
# Engine fields that name nothing on the host (engine_kinds.py's specs): a client sets them freely.
CLIENT_FIELDS = frozenset({"llm", "speed", "fork_model", "timing", "kv_pool", "kv_pool_gib"})


def check_names(sources: EngineSources) -> str | None:
    """What is wrong with the setting, or None. A name must not look like a value, so that what
    the operator's own command line passes (absolute paths, URLs) is never taken for a name."""
    for kind in HOST_FIELDS.values():
        for name in getattr(sources, kind):
            if not name or "/" in name or ":" in name:
                return (f"setting engine_sources.{kind}: name {name!r} must be a plain word "
                        "(no '/' or ':'), told apart from the paths and URLs it stands for")
    return None


def refusal(engine: Any, sources: EngineSources) -> str | None:
    """Why a plain client may not create a job with this `options["engine"]`, or None.
    Looks at the strings only: nothing is opened or fetched."""
    if engine is None:
        return None
    if not isinstance(engine, dict):
        return f"options[{ENGINE_OPTION!r}] must be a mapping"
    for key, value in engine.items():
        if key in HOST_FIELDS:
            if value is None or _allowed(key, value, sources):
                continue
            kind = HOST_FIELDS[key]
            names = ", ".join(sorted(getattr(sources, kind))) or "none"
            return (f"options[{ENGINE_OPTION!r}][{key!r}] is not among this scheduler's allowed "
                    f"{kind.replace('_', ' ')} (setting engine_sources.{kind}: {names}); "
                    "name one of them")
        if key not in CLIENT_FIELDS:
            return (f"options[{ENGINE_OPTION!r}] field {key!r} is not one a client may set on this "
                    f"scheduler (allowed: {', '.join(sorted(CLIENT_FIELDS | set(HOST_FIELDS)))})")
    return None


def _allowed(key: str, value: Any, sources: EngineSources) -> bool:
    if not isinstance(value, str):
        return False
    allowed = getattr(sources, HOST_FIELDS[key])
    if value in allowed or value in allowed.values():
        return True
    return key == "trace" and _packaged_trace(value)


def _packaged_trace(value: str) -> bool:
    """One of the package's own traces (bundled or generated), by its path as the scheduler's
    host has it: `specgen optimize --scheduler` sends the resolved path of the problem's trace.
    Compared as a string; `..` stays in the parent and so never matches."""
    from specgen.traces.bundled import GENERATED_TRACES_DIR, TRACE_SUFFIX, TRACES_DIR

    path = PurePath(value)
    if not path.is_absolute() or not path.name.endswith(TRACE_SUFFIX):
        return False
    folders = {str(d) for d in (TRACES_DIR, GENERATED_TRACES_DIR)}
    folders |= {str(d.resolve()) for d in (TRACES_DIR, GENERATED_TRACES_DIR)}
    return str(path.parent) in folders


def resolve(options: dict[str, Any], sources: EngineSources) -> "Redactor":
    """Replace allowed names in `options["engine"]` by their values (in place) and return what
    hides those values again in the job's reports. Anything else is left as it is: a job the
    scheduler took was checked when it was created (or came from the admin)."""
    engine = options.get(ENGINE_OPTION)
    hidden: dict[str, str] = {}
    if not isinstance(engine, dict):
        return Redactor(hidden)
    for key, kind in HOST_FIELDS.items():
        value = engine.get(key)
        if not isinstance(value, str):
            continue
        allowed = getattr(sources, kind)
        if value in allowed:
            engine[key] = allowed[value]
            hidden[allowed[value]] = f"<{key} {value}>"
        else:
            for name, allowed_value in allowed.items():
                if allowed_value == value:
                    hidden[value] = f"<{key} {name}>"
    return Redactor(hidden)


class Redactor:
    """Replaces host paths and URLs a job was allowed to use by their names, in any string of a
    message's builtins (an engine's error quotes its model directory or its server's URL)."""

    def __init__(self, hidden: dict[str, str]) -> None:
        pairs: dict[str, str] = {}
        for value, label in hidden.items():
            # Only what says where things are on the host: a served model's name says nothing.
            if "://" in value:
                pairs[value] = label
                pairs[value.rstrip("/")] = label      # as the HTTP engine keeps its base URL
            elif os.path.isabs(value):
                pairs[value] = label
                pairs[os.path.realpath(value)] = label  # as libraries quote a path they resolved
        pairs.pop("", None)
        self._pairs = sorted(pairs.items(), key=lambda kv: -len(kv[0]))   # longest first

    def __call__(self, obj: Any) -> Any:
        if not self._pairs:
            return obj
        if isinstance(obj, str):
            for value, label in self._pairs:
                obj = obj.replace(value, label)
            return obj
        if isinstance(obj, dict):
            return {key: self(item) for key, item in obj.items()}
        if isinstance(obj, list):
            return [self(item) for item in obj]
        return obj
