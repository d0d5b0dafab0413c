"""Static cheat guards: what a candidate's source shows before it runs.

Each finding is a flag string `"<code>: <reason>"`; the codes are listed in
`specgen.eval.guards.FLAG_CODES` (shared with the runtime guards and the probes). A flagged
candidate is rejected even when its outputs match, because these patterns are how known reward
hacks work (timer patches, side streams, fallbacks to PyTorch, memoization, lazy tensors,
precision changes, reaching outside its own module). The runtime guards and the probes catch
what a rename or an indirection hides from this scan.
"""
from __future__ import annotations

import ast
import re

_TIMER_WORDS = ("perf_counter", "monotonic", "time", "process_time", "Event", "elapsed_time",
                "record", "synchronize", "do_bench", "Timer", "benchmark")
_ALLOWED_SETTINGS = {"torch.backends.cudnn.benchmark", "torch.backends.cudnn.deterministic"}
_PRECISION_ATTRS = {"allow_tf32", "allow_fp16_reduced_precision_reduction",
                    "allow_bf16_reduced_precision_reduction", "set_float32_matmul_precision",
                    "autocast", "fp32_precision", "allow_fp16_accumulation"}
_THREAD_MODULES = {"threading", "_thread", "concurrent", "multiprocessing", "asyncio"}
_INTROSPECTION_MODULES = {"gc", "inspect", "ctypes", "importlib", "builtins", "specgen",
                          "subprocess", "signal", "__main__", "cffi"}
_INTROSPECTION_ATTRS = {"_getframe", "f_back", "f_locals", "f_globals", "modules", "gi_frame",
                        "tb_frame", "__builtins__", "_exit", "kill", "get_objects", "get_referrers"}
_STREAM_ATTRS = {"Stream", "stream", "ExternalStream", "set_stream"}
_SUBCLASS_CALLS = {"_make_subclass", "_make_wrapper_subclass", "as_subclass"}
_CACHE_DECORATORS = {"lru_cache", "cache", "cached_property"}

# Patterns inside C++/CUDA source strings handed to load_inline.
_NATIVE_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("side-stream", re.compile(r"cudaStreamCreate|getStreamFromPool|cudaStreamNonBlocking|"
                               r"cudaStreamCreateWithFlags|cudaStreamCreateWithPriority")),
    ("thread", re.compile(r"std::thread|std::async|pthread_create|std::jthread")),
    ("timer-patch", re.compile(r"cudaEventRecord|cudaEventElapsedTime")),
]


def dotted(node: ast.AST) -> str | None:
    """`a.b.c` for an attribute chain rooted at a name, else None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


class _Scanner(ast.NodeVisitor):
    def __init__(self) -> None:
        self.flags: dict[str, str] = {}       # first reason per code, in discovery order
        self.module_aliases: dict[str, str] = {}  # local name -> imported module path

    def add(self, code: str, line: int, reason: str) -> None:
        self.flags.setdefault(code, f"{code}: line {line}: {reason}")

    # --- imports
    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.module_aliases[(alias.asname or alias.name).split(".")[0]] = (
                alias.name if alias.asname else alias.name.split(".")[0])
            self._check_import(alias.name, node.lineno)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        self._check_import(module, node.lineno)
        for alias in node.names:
            full = f"{module}.{alias.name}" if module else alias.name
            self.module_aliases[alias.asname or alias.name] = full
            self._check_import(full, node.lineno)
            if alias.name in _PRECISION_ATTRS:
                self.add("precision", node.lineno, f"imports {full}")

    def _check_import(self, name: str, line: int) -> None:
        root = name.split(".")[0]
        if root in _THREAD_MODULES:
            self.add("thread", line, f"imports {name}")
        if root in _INTROSPECTION_MODULES or name in ("sys._getframe", "sys.modules"):
            self.add("introspection", line, f"imports {name}")

    # --- control flow
    def visit_Try(self, node: ast.Try) -> None:
        only_imports = all(isinstance(s, (ast.Import, ast.ImportFrom)) for s in node.body)
        for handler in node.handlers:
            reraises = any(isinstance(s, ast.Raise) for s in ast.walk(handler))
            if not reraises and not only_imports:
                self.add("try-fallback", handler.lineno,
                         "an except clause that does not re-raise (fallback path)")
        self.generic_visit(node)

    visit_TryStar = visit_Try

    # --- assignments that patch modules
    def _check_target(self, target: ast.AST, line: int) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for elt in target.elts:
                self._check_target(elt, line)
            return
        if not isinstance(target, ast.Attribute):
            return
        path = dotted(target)
        if path is None:
            return
        root = path.split(".")[0]
        if root not in self.module_aliases:
            return  # self.x = ..., obj.attr = ...: the candidate's own objects
        full = self.module_aliases[root] + path[len(root):]
        if full in _ALLOWED_SETTINGS:
            return
        last = full.split(".")[-1]
        if last in _PRECISION_ATTRS:
            self.add("precision", line, f"sets {full}")
        elif any(word in full for word in _TIMER_WORDS):
            self.add("timer-patch", line, f"replaces {full}")
        else:
            self.add("monkey-patch", line, f"replaces {full}")

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._check_target(target, node.lineno)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._check_target(node.target, node.lineno)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._check_target(node.target, node.lineno)
        self.generic_visit(node)

    # --- classes and functions
    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for base in node.bases:
            name = dotted(base) or ""
            if name.split(".")[-1] == "Tensor":
                self.add("lazy-tensor", node.lineno, f"class {node.name} subclasses {name}")
        self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        if node.name in ("__torch_function__", "__torch_dispatch__"):
            self.add("lazy-tensor", node.lineno, f"defines {node.name}")
        for deco in node.decorator_list:
            target = deco.func if isinstance(deco, ast.Call) else deco
            name = (dotted(target) or "").split(".")[-1]
            if name in _CACHE_DECORATORS:
                self.add("memoized", deco.lineno, f"@{name} on {node.name}")
        if isinstance(node, ast.AsyncFunctionDef):
            self.add("thread", node.lineno, f"async def {node.name}")
        self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    # --- expressions
    def visit_Attribute(self, node: ast.Attribute) -> None:
        path = dotted(node) or ""
        root = path.split(".")[0] if path else ""
        full = (self.module_aliases.get(root, root) + path[len(root):]) if path else ""
        if node.attr in _INTROSPECTION_ATTRS and (node.attr.startswith("f_") or
                                                  full.startswith(("sys.", "os.", "gc."))
                                                  or node.attr in ("_getframe", "__builtins__")):
            self.add("introspection", node.lineno, f"uses {path or node.attr}")
        if node.attr in _STREAM_ATTRS and full.startswith("torch.cuda"):
            self.add("side-stream", node.lineno, f"uses {full}")
        if node.attr in _PRECISION_ATTRS:
            self.add("precision", node.lineno, f"uses {path or node.attr}")
        if node.attr == "CUDAGraph" or full.startswith("torch.cuda.graph"):
            pass  # graph replay is judged dynamically (fresh buffers, in-place refresh probe)
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in ("__builtins__", "__main__"):
            self.add("introspection", node.lineno, f"uses {node.id}")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        name = dotted(node.func) or ""
        last = name.split(".")[-1]
        if last in _SUBCLASS_CALLS:
            self.add("lazy-tensor", node.lineno, f"calls {name}")
        if last == "setattr" and node.args:
            root = (dotted(node.args[0]) or "").split(".")[0]
            if root in self.module_aliases:
                self.add("monkey-patch", node.lineno, f"setattr on module {root}")
        if last == "__import__":
            self.add("introspection", node.lineno, "calls __import__")
        if last in ("get", "setdefault", "__contains__", "__getitem__") and \
                any(_is_identity_key(arg) for arg in node.args):
            self.add("memoized", node.lineno, "results looked up by data pointer or object id")
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if _is_identity_key(node.slice):
            self.add("memoized", node.lineno, "results indexed by data pointer or object id")
        self.generic_visit(node)

    def visit_Dict(self, node: ast.Dict) -> None:
        if any(key is not None and _is_identity_key(key) for key in node.keys):
            self.add("memoized", node.lineno, "dict keyed by data pointer or object id")
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        # `x.data_ptr() == self._last_ptr`, `id(x) in self.seen`: a pointer compared with a stored one
        sides = [node.left, *node.comparators]
        identity_ops = (ast.In, ast.NotIn, ast.Eq, ast.NotEq, ast.Is, ast.IsNot)
        if any(isinstance(op, identity_ops) for op in node.ops) and \
                any(_is_identity_key(side) for side in sides) and \
                any(isinstance(side, (ast.Attribute, ast.Name, ast.Subscript))
                    for side in sides if not _is_identity_key(side)):
            self.add("memoized", node.lineno, "compares data pointers/ids with stored ones")
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and len(node.value) > 20:
            for code, pattern in _NATIVE_PATTERNS:
                match = pattern.search(node.value)
                if match:
                    self.add(code, node.lineno, f"native source uses {match.group(0)}")
            if "/proc/" in node.value:
                self.add("introspection", node.lineno, "reads /proc")


def _is_identity_key(node: ast.AST) -> bool:
    """An expression containing `x.data_ptr()`, `id(x)` or `x.untyped_storage().data_ptr()`."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            name = dotted(sub.func) or (sub.func.attr if isinstance(sub.func, ast.Attribute)
                                        else "")
            last = name.split(".")[-1]
            if last == "data_ptr" or (name == "id" and sub.args):
                return True
    return False


def scan_source(tree: ast.Module) -> list[str]:
    """Flags for a parsed candidate, at most one per code, in source order of discovery."""
    scanner = _Scanner()
    scanner.visit(tree)
    return list(scanner.flags.values())
