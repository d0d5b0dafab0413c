"""Dependencies point one way: every import inside `specgen` (function-level ones included) goes to
its own package or to a lower layer, so no two top-level packages import each other."""
from __future__ import annotations

import ast
from pathlib import Path

import specgen

ROOT = Path(specgen.__file__).resolve().parent

# Lowest first. Packages of one layer do not import each other.
LAYERS = [
    {"clock"},                             # time, injected: real or virtual (simulation)
    {"errors"},
    {"processes"},                         # facts about a pid (alive?) for eval and runtime
    {"messages"},
    {"wire"},                              # the one framing of every ZeroMQ channel
    {"backend"},                           # the evaluation interface
    {"eval", "kv", "engines"},
    {"traces"},                            # the trace format, replay (an engine), import, recording, the
    #                                        generator, with the bundled-problems index and code extraction
    #                                        they read traces with; the loop in optimize uses all of it
    {"runtime"},
    {"optimize"},
    {"simulate"},                          # discrete-event runs over runtime and optimize
    {"bench"},                             # `specgen bench`: drives the optimize loop (wall clock) and
    #                                        the simulator (virtual clock); nothing imports it
    {"cli"},
]
RANK = {name: i for i, layer in enumerate(LAYERS) for name in layer}


def sources() -> list[Path]:
    """The package's code (not data/: problems and candidates, which only torch and triton import)."""
    return sorted(p for p in ROOT.rglob("*.py") if not p.is_relative_to(ROOT / "data"))


def top_level(module: Path) -> str:
    parts = module.relative_to(ROOT).with_suffix("").parts
    return parts[0]


def imported_packages(path: Path) -> set[tuple[str, int]]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
            if node.module == "specgen":
                names = [f"specgen.{alias.name}" for alias in node.names]
        for name in names:
            if name.startswith("specgen."):
                found.add((name.split(".")[1], node.lineno))
    return found


def test_every_package_has_a_layer() -> None:
    packages = {top_level(p) for p in sources() if p != ROOT / "__init__.py"}
    assert packages - set(RANK) == set(), "give new top-level modules a layer in LAYERS"


def test_imports_point_down() -> None:
    wrong = []
    for path in sources():
        if path.parent == ROOT and path.name == "__init__.py":
            continue      # the package's lazy `specgen.Client` reaches the top on purpose
        own = top_level(path)
        for target, line in sorted(imported_packages(path)):
            if target == own or target not in RANK:
                continue
            if RANK[target] >= RANK[own]:
                wrong.append(f"{path.relative_to(ROOT.parent)}:{line} imports specgen.{target}")
    assert wrong == []


def _module_name(path: Path) -> str:
    parts = ("specgen",) + path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _module_imports(path: Path, modules: set[str]) -> set[str]:
    """The specgen modules `path` imports at run time (function-level imports included, the
    `if TYPE_CHECKING:` block left out: it never runs). `from pkg import sub` names the
    submodule, not the package's __init__."""
    tree = ast.parse(path.read_text(), str(path))
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(n) for n in ast.walk(node)}
    found = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in modules}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = {f"{node.module}.{a.name}" for a in node.names} & modules
            found |= subs or ({node.module} & modules)
    return found


def test_no_module_imports_itself_through_others() -> None:
    """No file-level import cycle in specgen/: a module's own imports never lead back to it."""
    paths = {_module_name(p): p for p in sources()}
    graph = {name: _module_imports(p, set(paths)) - {name} for name, p in paths.items()}
    cycles = []

    def visit(name: str, trail: list[str], done: set[str]) -> None:
        for nxt in sorted(graph[name]):
            if nxt in trail:
                cycles.append(trail[trail.index(nxt):] + [nxt])
            elif nxt not in done:
                visit(nxt, trail + [nxt], done)
        done.add(name)

    done: set[str] = set()
    for name in sorted(graph):
        if name not in done:
            visit(name, [name], done)
    # A package's __init__ re-exporting its modules is not a cycle of theirs.
    cycles = [c for c in cycles if not any(a.startswith(b + ".") or b.startswith(a + ".")
                                           for a, b in zip(c, c[1:]))]
    assert cycles == [], " ; ".join(" -> ".join(c) for c in cycles[:5])
