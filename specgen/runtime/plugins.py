"""Plug-ins: modules that register engines and fork models, loaded in every process specgen starts.

A registry (`optimize/engine_kinds.py`, `optimize/fork_models.py`) lives in one process's memory,
and the process that builds a job is not the one that decodes it: the scheduler starts each job's
reasoner as a process of its own, which imports only what specgen itself imports. A registration
made by importing a module in the `specgen` command alone is therefore unknown where the job runs
(its `options["engine"]` fails to decode there). So each process finds its plug-ins by itself, at
its start, from two places:

- the entry-point group `specgen.plugins` of the installed distributions: for a plug-in shipped as
  a package (`[project.entry-points."specgen.plugins"]`, `toy = "toy_pkg.plugin"`);
- the environment variable `SPECGEN_PLUGINS`: a comma-separated list, for a plug-in that is a module
  on the Python path rather than an installed package. Every process specgen starts inherits the
  environment of the one that started it (`runtime/child_process.py`), so a list set where the
  command runs reaches the scheduler, nodes, workers and reasoners of the cluster it starts.

Either names a module, imported for the registrations it makes at import, or a function
`module:function`, called once with no arguments. `load_plugins()` loads them all, each once per
process; every process's entry point calls it before it talks to any other process or builds a
parser: the `specgen` command (so `--llm` and `--fork-model` offer a plug-in's names), the
scheduler, a node, a worker, a job's reasoner (after each took its secrets out of the environment). The KV pool's agent and the evaluation runners do not: they decode no
message a registry types, and a runner runs the candidate's code, nothing else.

A plug-in that fails to load is a `PluginError` naming it and where it was named: a process that
went on without it would fail later, where a job's engine or fork model is decoded, with an error
that does not say why. Only the operator sets either source (the environment of the processes, the
packages installed): a client of the scheduler cannot make it import anything.
"""
from __future__ import annotations

import importlib
import logging
import os
import threading
import types
from collections.abc import Mapping

from specgen.errors import UsageError

log = logging.getLogger(__name__)

PLUGINS_ENV = "SPECGEN_PLUGINS"
ENTRY_POINT_GROUP = "specgen.plugins"


class PluginError(UsageError):
    """A plug-in could not be loaded; the message names it and where it was named."""


_lock = threading.RLock()     # re-entrant: a plug-in's code may ask what is loaded
_loaded: dict[str, str] = {}     # target ("module" or "module:function") -> where it was named


def plugins_from_env(environ: Mapping[str, str] = os.environ) -> list[str]:
    """The targets `SPECGEN_PLUGINS` names, in order."""
    return [part.strip() for part in environ.get(PLUGINS_ENV, "").split(",") if part.strip()]


def load_plugins(environ: Mapping[str, str] = os.environ) -> list[str]:
    """Load the plug-ins of the entry-point group, then those `SPECGEN_PLUGINS` names, each once in
    this process; the targets loaded so far, in load order. Raises PluginError."""
    with _lock:
        for target, where in [*_entry_point_targets(), *((t, f"${PLUGINS_ENV}") for t in plugins_from_env(environ))]:
            if target not in _loaded:     # a function runs once: a second call would register twice
                _load(target, where)
                _loaded[target] = where
                log.info("plug-in %s loaded (%s)", target, where)
        return list(_loaded)


def loaded_plugins() -> list[str]:
    """What `load_plugins` loaded in this process, in load order."""
    with _lock:
        return list(_loaded)


def unknown_name_hint() -> str:
    """Said beside a registry's "unknown name" error: the name may be a plug-in's this process lacks."""
    loaded = loaded_plugins()
    return (f"plug-ins loaded in this process: {', '.join(loaded) or 'none'}; a plug-in reaches every "
            f"process through ${PLUGINS_ENV} or the entry-point group {ENTRY_POINT_GROUP!r} (docs/engines.md)")


def _entry_point_targets() -> list[tuple[str, str]]:
    from importlib.metadata import entry_points

    found = []
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name):
        dist = getattr(ep, "dist", None)
        owner = f" of {dist.name}" if dist is not None else ""
        target = ep.value.partition("[")[0].replace(" ", "")    # extras ("mod:f [x]") name no code
        found.append((target, f"entry point {ep.name!r}{owner} in {ENTRY_POINT_GROUP!r}"))
    return found


def _load(target: str, where: str) -> None:
    module_name, _, attr = target.partition(":")
    if not module_name or (":" in target and not attr):
        raise PluginError(f"plug-in {target!r} ({where}) must be 'module' or 'module:function'")
    try:
        obj: object = importlib.import_module(module_name)
        for part in attr.split(".") if attr else []:
            obj = getattr(obj, part)
        if not isinstance(obj, types.ModuleType):
            if not callable(obj):
                raise TypeError(f"{attr} is neither a module nor a function")
            obj()
    except Exception as exc:  # noqa: BLE001 - whatever a plug-in raises, name the plug-in
        raise PluginError(f"plug-in {target!r} ({where}) failed to load: {type(exc).__name__}: {exc}") from exc
