"""Reading KernelBench-format problems and candidates from a file or a string.

Loading here is static: the source is read, hashed and parsed, and the names evaluation needs are
checked (`Model`, `get_inputs`, `get_init_inputs` for a problem; `ModelNew` for a candidate; that
`ModelNew` can be called the way `Model` is). Nothing is executed: that happens only inside a
runner subprocess (`exec_source`), each source in a module namespace of its own, so that nothing a
candidate defines can reach the problem's globals (KernelBench executes both in one namespace,
which lets a candidate's module constants change the problem's input shapes).

Bad input raises `UsageError` with a message naming the file and what to fix.
"""
from __future__ import annotations

import ast
import hashlib
import linecache
import os
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

from specgen.errors import UsageError

# Source markers of custom kernels; a candidate carrying one claims that its own kernel runs.
_TRITON_MARKERS = ("triton.jit", "@jit", "triton.autotune", "tl.program_id")
_EXTENSION_MARKERS = ("load_inline", "cpp_extension")


@dataclass(frozen=True)
class SourceFile:
    """A Python source with where it came from and its content hash."""

    text: str
    origin: str                      # file path, or "<string>"
    sha256: str
    tree: ast.Module = field(repr=False, compare=False)

    @property
    def short_hash(self) -> str:
        return self.sha256[:16]


@dataclass(frozen=True)
class ProblemSource(SourceFile):
    """A reference program: `class Model`, `get_inputs()`, `get_init_inputs()`."""

    name: str = "problem"


@dataclass(frozen=True)
class CandidateSource(SourceFile):
    """A candidate program defining `ModelNew`."""

    kernel_kinds: tuple[str, ...] = ()   # "triton", "extension": custom kernels it claims to run

    @property
    def claims_custom_kernels(self) -> bool:
        return bool(self.kernel_kinds)

    @property
    def needs_build(self) -> bool:
        return "extension" in self.kernel_kinds


def _read(src_or_path: str | os.PathLike[str], what: str) -> tuple[str, str]:
    """Return (text, origin). A str with a newline is source text; otherwise it names a file."""
    if isinstance(src_or_path, os.PathLike) or ("\n" not in src_or_path and src_or_path.strip()):
        path = Path(src_or_path)
        if not path.is_file():
            hint = "" if str(path).endswith(".py") else " (pass source text with at least one newline)"
            raise UsageError(f"{what} file not found: {path}{hint}")
        try:
            return path.read_text(encoding="utf-8"), str(path)
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read {what} file {path}: {exc}") from None
    if not src_or_path.strip():
        raise UsageError(f"{what} source is empty")
    return src_or_path, "<string>"


def _parse(text: str, origin: str, what: str) -> ast.Module:
    try:
        return ast.parse(text, filename=origin)
    except SyntaxError as exc:
        where = f"line {exc.lineno}" if exc.lineno else "unknown line"
        raise UsageError(f"{what} {origin}: syntax error at {where}: {exc.msg}") from None
    except ValueError as exc:  # e.g. null bytes
        raise UsageError(f"{what} {origin}: not valid Python source: {exc}") from None


def top_level_names(tree: ast.Module) -> dict[str, ast.AST]:
    """Names bound at module level (class, def, assignment, import) to the node binding them."""
    names: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names[node.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    names[target.id] = node
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                names[(alias.asname or alias.name).split(".")[0]] = node
    return names


def called_name(func: ast.AST) -> str:
    """The name a call is made by: `f(...)` and `x.f(...)` both give "f"."""
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def _method(cls: ast.AST, name: str) -> ast.FunctionDef | None:
    if not isinstance(cls, ast.ClassDef):
        return None
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    return None


def _arity(fn: ast.FunctionDef) -> tuple[int, int | None]:
    """(required, maximum) positional arguments after `self`; maximum None when *args."""
    positional = [*fn.args.posonlyargs, *fn.args.args][1:]
    required = len(positional) - len(fn.args.defaults)
    maximum = None if fn.args.vararg else len(positional)
    return max(required, 0), maximum


def load_problem(src_or_path: str | os.PathLike[str], name: str | None = None) -> ProblemSource:
    """Read and statically check a KernelBench-format problem (file path or source text)."""
    text, origin = _read(src_or_path, "problem")
    return problem_from_text(text, origin, name)


def problem_from_text(text: str, origin: str = "<string>", name: str | None = None
                      ) -> ProblemSource:
    """Statically check problem source text (see `load_problem`)."""
    tree = _parse(text, origin, "problem")
    names = top_level_names(tree)
    missing = [n for n in ("Model", "get_inputs", "get_init_inputs") if n not in names]
    if missing:
        raise UsageError(f"problem {origin}: missing {', '.join(missing)} (a KernelBench problem "
                         "defines class Model, get_inputs() and get_init_inputs())")
    if isinstance(names["Model"], ast.ClassDef) and _method(names["Model"], "forward") is None \
            and not names["Model"].bases:
        raise UsageError(f"problem {origin}: class Model has no forward method")
    if name is None:
        name = Path(origin).stem if origin != "<string>" else "problem"
    return ProblemSource(text=text, origin=origin, sha256=_sha(text), tree=tree, name=name)


def load_candidate(src_or_path: str | os.PathLike[str],
                   problem: ProblemSource | None = None) -> CandidateSource:
    """Read and statically check a candidate; with `problem`, also check ModelNew's signature."""
    text, origin = _read(src_or_path, "candidate")
    return candidate_from_text(text, origin, problem)


def candidate_from_text(text: str, origin: str = "<string>",
                        problem: ProblemSource | None = None) -> CandidateSource:
    """Statically check candidate source text (see `load_candidate`)."""
    tree = _parse(text, origin, "candidate")
    names = top_level_names(tree)
    if "ModelNew" not in names:
        raise UsageError(f"candidate {origin}: no ModelNew defined (a candidate defines "
                         "class ModelNew(nn.Module) with the same constructor and forward "
                         "arguments as the problem's Model)")
    if problem is not None:
        check_signature(problem, names["ModelNew"], origin)
    kinds = []
    if any(marker in text for marker in _TRITON_MARKERS) and "triton" in text:
        kinds.append("triton")
    if any(marker in text for marker in _EXTENSION_MARKERS):
        kinds.append("extension")
    return CandidateSource(text=text, origin=origin, sha256=_sha(text), tree=tree,
                           kernel_kinds=tuple(kinds))


def check_signature(problem: ProblemSource, model_new: ast.AST, origin: str) -> None:
    """ModelNew must accept what Model's constructor and forward receive (when both are plain)."""
    model = top_level_names(problem.tree).get("Model")
    for method, what in (("forward", "forward inputs"), ("__init__", "constructor arguments")):
        ref_fn, cand_fn = _method(model, method), _method(model_new, method)
        if ref_fn is None or cand_fn is None:
            continue  # inherited or defined elsewhere: the runner finds out
        ref_required, ref_max = _arity(ref_fn)
        cand_required, cand_max = _arity(cand_fn)
        # The harness calls with exactly as many arguments as get_inputs()/get_init_inputs() give,
        # which Model accepts: between ref_required and ref_max.
        too_few = cand_max is not None and cand_max < ref_required
        too_many = ref_max is not None and cand_required > ref_max
        if too_few or too_many:
            raise UsageError(
                f"candidate {origin}: ModelNew.{method} takes {_describe(cand_required, cand_max)} "
                f"but Model.{method} takes {_describe(ref_required, ref_max)} ({what} must match)")


def _describe(required: int, maximum: int | None) -> str:
    if maximum is None:
        return f"at least {required} arguments"
    if maximum == required:
        return f"{required} argument{'s' if required != 1 else ''}"
    return f"{required} to {maximum} arguments"


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def exec_source(source: SourceFile, module_name: str, directory: Path | None = None
                ) -> types.ModuleType:
    """Execute a source in a fresh module of its own and return the module.

    The text is written to `directory` (when given) so tracebacks and `inspect.getsource` (which
    Triton's `@jit` needs) find it; it is also put in `linecache` for the same reason.
    """
    filename = f"<{module_name}>"
    if directory is not None:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"{module_name}.py"
        path.write_text(source.text, encoding="utf-8")
        filename = str(path)
    linecache.cache[filename] = (len(source.text), None, source.text.splitlines(True), filename)
    module = types.ModuleType(module_name)
    module.__file__ = filename
    # Registered so that dataclasses, pickling and Triton's source lookup can find the module.
    sys.modules[module_name] = module
    code = compile(source.text, filename, "exec", dont_inherit=True)
    exec(code, module.__dict__)
    return module
