"""Message fields that take one of a few known values are typed as `Literal`s: a value outside them
is refused where the message is decoded, with the field named, and every value the code sends
decodes back as itself.

The values the code sends are also read out of its source (`test_the_code_sends_only_known_values`),
so that a new value written into a producer without its message's type fails here, not in a live
message that a peer cannot decode.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Any, get_args

import msgspec
import pytest

from specgen import wire
from specgen.messages import (
    CandidateOrigin, CandidateRecord, CandidateStatus, CandidateSubmission, EvalOptions, ForkOutcome,
    ForkRecord, ForkRunner, Hello, JobOutcome, JobResult, JobRunState, JobSpec, JobStatus, OptimizeEvent,
    OptimizeMode, OptimizeResult, OptimizeSpec, OptimizeStatus, OutputKind, OutputMeta, PeerRole, Pool,
    PoolMode, PoolStat, RunnerReady, RunnerRole, SandboxKind, SandboxMode, SchedulerStats, Verdict,
    WorkerStat,
)
from specgen.runtime.settings import RuntimeSettings

SPECGEN = Path(__file__).resolve().parents[2] / "specgen"


def _values(*aliases: Any) -> tuple[str, ...]:
    out: list[str] = []
    for alias in aliases:
        out.extend(get_args(alias) if not isinstance(alias, str) else (alias,))
    return tuple(out)


# (struct, a valid message, field, every value it takes)
FIELDS: list[tuple[type, Any, str, tuple[str, ...]]] = [
    (Hello, Hello(role="worker", name="n"), "role", _values(PeerRole)),
    (ForkRunner, ForkRunner(role="candidate", scratch_mb=1, max_processes=1), "role", _values(RunnerRole)),
    (RunnerReady, RunnerReady(role="reference", pid=1, device="cpu", device_name="x"), "role",
     _values(RunnerRole, "template")),
    (Verdict, Verdict(), "sandbox", _values(SandboxKind)),
    (EvalOptions, EvalOptions(), "sandbox", _values(SandboxMode)),
    (CandidateSubmission, CandidateSubmission(job_id="j", candidate_id="c", problem_name="p",
                                              problem_source="s", candidate_source="t"),
     "origin", _values(CandidateOrigin)),
    (OptimizeSpec, OptimizeSpec(job_id="j", problem_name="p", problem_source="s"), "mode",
     _values(OptimizeMode)),
    (OptimizeEvent, OptimizeEvent(job_id="j", kind="candidate", t=0.0), "origin",
     _values("", CandidateOrigin)),
    (ForkRecord, ForkRecord(request_id="r", iteration=1, position=0, trigger="t", started_at=0.0),
     "outcome", _values(ForkOutcome)),
    (CandidateRecord, CandidateRecord(candidate_id="c", iteration=1, origin="fork", request_id="r",
                                      position=0, fingerprint="f", source="s", extracted_at=0.0),
     "origin", _values(CandidateOrigin)),
    (CandidateRecord, CandidateRecord(candidate_id="c", iteration=1, origin="fork", request_id="r",
                                      position=0, fingerprint="f", source="s", extracted_at=0.0),
     "status", _values(CandidateStatus)),
    (OptimizeResult, OptimizeResult(job_id="j", problem_name="p", mode="specgen", status="failed"),
     "mode", _values(OptimizeMode)),
    (OptimizeResult, OptimizeResult(job_id="j", problem_name="p", mode="specgen", status="failed"),
     "status", _values(OptimizeStatus)),
    (JobResult, JobResult(job_id="j", status="failed"), "status", _values(JobOutcome)),
    (JobStatus, JobStatus(spec=JobSpec(), state="running"), "state", _values(JobRunState)),
    (WorkerStat, WorkerStat(name="w"), "pool", _values(Pool)),
    (WorkerStat, WorkerStat(name="w"), "pending_pool", _values("", Pool)),
    (SchedulerStats, SchedulerStats(scheduler_id="s", uptime_s=0.0, pool_mode="elastic", priority_rule=[],
                                    validate=PoolStat(), profile=PoolStat()),
     "pool_mode", _values(PoolMode)),
]
IDS = [f"{cls.__name__}.{field}" for cls, _, field, _ in FIELDS]


def _with(message: Any, field: str, value: Any) -> bytes:
    """`message` with `field` set to `value`, as its peer would encode it (nothing checks the
    value on the way out: a struct's constructor does not validate)."""
    return msgspec.msgpack.encode(msgspec.structs.replace(message, **{field: value}))


@pytest.mark.parametrize("cls, message, field, values", FIELDS, ids=IDS)
def test_every_value_decodes_back_as_itself(cls, message, field, values) -> None:
    for value in values:
        back = msgspec.msgpack.decode(_with(message, field, value), type=cls)
        assert getattr(back, field) == value


@pytest.mark.parametrize("cls, message, field, values", FIELDS, ids=IDS)
def test_a_wrong_value_is_refused_naming_the_field(cls, message, field, values) -> None:
    for wrong in ("bogus", values[0].upper() or "x", 3):
        with pytest.raises(msgspec.ValidationError, match=f"at `\\$\\.{field}`"):
            msgspec.msgpack.decode(_with(message, field, wrong), type=cls)


def test_an_output_leaf_of_another_kind_is_refused_at_its_place() -> None:
    """OutputMeta travels as an array (array_like), so the error names the field by its place."""
    from specgen.messages import Called

    for kind in get_args(OutputKind):
        called = Called(index=1, outputs=[OutputMeta(kind=kind)])
        assert msgspec.msgpack.decode(msgspec.msgpack.encode(called), type=Called) == called
    bad = msgspec.msgpack.encode(Called(index=1, outputs=[OutputMeta(kind="tensr")]))
    with pytest.raises(msgspec.ValidationError, match=r"'tensr' - at `\$\.outputs\[0\]\[0\]`"):
        msgspec.msgpack.decode(bad, type=Called)


def test_a_frame_with_a_wrong_value_is_answered_with_the_field_named() -> None:
    frame = b"".join(wire.encode(Hello(role="wizard", name="n")))
    with pytest.raises(wire.WireError) as err:
        wire.decode_frame(frame, 1 << 20)
    assert err.value.code == "malformed" and "$.role" in err.value.message


def test_settings_take_only_the_known_pool_modes() -> None:
    from specgen.errors import UsageError

    for mode in get_args(PoolMode):
        assert RuntimeSettings().with_overrides([f"pool_mode={mode}"]).pool_mode == mode
    with pytest.raises(UsageError, match=r"\$\.pool_mode"):
        RuntimeSettings().with_overrides(["pool_mode=sometimes"])
    with pytest.raises(UsageError, match="pool_mode"):
        RuntimeSettings(pool_mode="sometimes").check()   # type: ignore[arg-type]


def test_the_code_s_lists_are_the_message_types() -> None:
    """Where code keeps a list of a field's values, it is the field's type (or, for what may not be
    edited from here, equal to it)."""
    from specgen.eval import sandbox
    from specgen.eval.evaluator import SANDBOX_MODES
    from specgen.optimize import job, verdicts
    from specgen.optimize.modes import MODES
    from specgen.runtime import priority, scheduler_metrics, worker_registry
    from specgen.runtime.auth import AUTHENTICATED_ROLES

    assert MODES == get_args(OptimizeMode)
    assert worker_registry.ROLES == get_args(PeerRole) and set(AUTHENTICATED_ROLES) <= set(get_args(PeerRole))
    assert priority.POOLS == scheduler_metrics.POOLS == get_args(Pool)
    assert SANDBOX_MODES == get_args(SandboxMode)
    assert {sandbox.NAMESPACES, sandbox.NONE} == set(get_args(SandboxKind))
    runtime_status = job._RUNTIME_STATUS
    assert set(runtime_status) == set(get_args(OptimizeStatus))
    assert set(runtime_status.values()) <= set(get_args(JobOutcome))
    assert verdicts.FINAL | {"pending"} == set(get_args(CandidateStatus))


# -- the values written in the source

# A keyword of a constructor (or of msgspec.structs.replace) -> the values it may take.
_KEYWORDS: dict[str, dict[str, tuple[str, ...]]] = {
    "Hello": {"role": _values(PeerRole)},
    "Client": {"role": _values(PeerRole)},                # its Hello's role
    "to_thread": {"role": _values(PeerRole)},             # a Client made in a thread (inprocess.py)
    "ForkRunner": {"role": _values(RunnerRole)},
    "RunnerReady": {"role": _values(RunnerRole, "template")},
    "OutputMeta": {"kind": _values(OutputKind)},
    "Verdict": {"sandbox": _values(SandboxKind)},
    "EvalOptions": {"sandbox": _values(SandboxMode)},
    "replace": {"sandbox": _values(SandboxMode)},
    "CandidateSubmission": {"origin": _values(CandidateOrigin)},
    "OptimizeSpec": {"mode": _values(OptimizeMode)},
    "OptimizeEvent": {"origin": _values("", CandidateOrigin)},
    "ForkRecord": {"outcome": _values(ForkOutcome)},
    "CandidateRecord": {"origin": _values(CandidateOrigin), "status": _values(CandidateStatus)},
    "OptimizeResult": {"mode": _values(OptimizeMode), "status": _values(OptimizeStatus)},
    "JobResult": {"status": _values(JobOutcome)},
    "JobStatus": {"state": _values(JobRunState)},
    "WorkerStat": {"pool": _values(Pool), "pending_pool": _values("", Pool)},
    "SchedulerStats": {"pool_mode": _values(PoolMode)},
    "RuntimeSettings": {"pool_mode": _values(PoolMode)},
}
# A positional argument of a call (name, index) -> the values it may take.
_POSITIONAL: dict[tuple[str, int], tuple[str, ...]] = {
    ("on_candidate", 1): _values(CandidateOrigin),        # optimize/forker.py
    ("_new_candidate", 2): _values(CandidateOrigin),      # optimize/loop.py
    ("submit", 1): _values(CandidateOrigin),              # simulate/simulation.py's SimJob.submit
    ("stop", 0): _values(OptimizeStatus),                 # optimize/job_end.py's JobEnd.stop
    ("fork", 0): _values(RunnerRole),                     # eval: Template.fork(role)
    ("_fork", 0): _values(RunnerRole),
}
# An attribute set in the optimize loop -> the values it may take (a CandidateRecord's status, a
# ForkRecord's outcome).
_ATTRIBUTES = {"status": _values(CandidateStatus), "outcome": _values(ForkOutcome)}
_DICT_KEYS = {"pool_mode": _values(PoolMode)}


def _constants(node: ast.AST) -> list[str]:
    """The string constants an expression can be: a constant, or either branch of `a if c else b`."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.IfExp):
        return _constants(node.body) + _constants(node.orelse)
    return []


def _name(func: ast.AST) -> str:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _sent(path: Path) -> list[tuple[int, str, str, tuple[str, ...]]]:
    """(line, what, value, allowed) for every known value written in `path`."""
    found = []
    in_loop = "optimize" in path.parts
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            name = _name(node.func)
            for kw in node.keywords:
                allowed = _KEYWORDS.get(name, {}).get(kw.arg or "")
                for value in _constants(kw.value) if allowed else ():
                    found.append((node.lineno, f"{name}({kw.arg}=)", value, allowed))
            for (callee, index), allowed in _POSITIONAL.items():
                if name == callee and len(node.args) > index and (callee != "stop" or in_loop):
                    for value in _constants(node.args[index]):
                        found.append((node.lineno, f"{callee}(#{index})", value, allowed))
        elif isinstance(node, ast.Dict):
            for key, value_node in zip(node.keys, node.values):
                allowed = _DICT_KEYS.get(key.value if isinstance(key, ast.Constant) else None)
                for value in _constants(value_node) if allowed else ():
                    found.append((node.lineno, f"{{{key.value!r}:}}", value, allowed))
        elif isinstance(node, ast.Assign) and in_loop:
            for target in node.targets:
                pairs = (zip(target.elts, node.value.elts)
                         if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple)
                         else [(target, node.value)])
                for one, value_node in pairs:
                    if isinstance(one, ast.Attribute) and one.attr in _ATTRIBUTES \
                            and _name(one.value) in ("record", "fork", "records"):
                        for value in _constants(value_node):
                            found.append((node.lineno, f".{one.attr} =", value, _ATTRIBUTES[one.attr]))
    return found


def test_the_code_sends_only_known_values() -> None:
    sent, wrong = 0, []
    for path in sorted(SPECGEN.rglob("*.py")):
        if "messages" in path.parts:
            continue
        for line, what, value, allowed in _sent(path):
            sent += 1
            if value not in allowed:
                wrong.append(f"{path.relative_to(SPECGEN.parent)}:{line}: {what} {value!r} "
                             f"is none of {allowed}")
    assert not wrong, "\n".join(wrong)
    assert sent > 40    # the scan finds the producers (a rename would leave it checking nothing)
