"""The house of spade's modules: which package imports which, and its three rules.

In: the source of every module of the packages spade_cli/, stages/ and sandbox/ (folders without
an __init__.py, such as the seed library's env programs, are data, not modules), parsed with
`ast`, never imported. An import counts at module level unless it sits in a function (or under
`if TYPE_CHECKING:`, which never runs); imports in functions count for the floors and the door.
Out (`python scripts/house.py`): per package, its module count and the packages it imports (at
module level; then those it imports only inside functions), then the tally
`cycles: N, imports up: N` and the imports past a sealed package's door, each broken rule on a
line of its own. Exit 0 when every rule holds, 1 otherwise. tests/test_house.py asserts the same.
The rules:
- no import cycle among modules, counting module-level imports only (a cycle there is a module
  that finds another half-initialised, depending on which is imported first);
- floors: sandbox/ never imports stages or spade_cli, stages/ never imports spade_cli (the jail
  knows nothing of the stages; the library prints nothing and knows nothing of the command);
- a sealed package (stages.train) is entered through its door: outside it, modules import from
  `stages.train` only what its `__all__` names, never one of its modules by its own path
  (`stages.train.loop`), unless ALLOWED names the import with its reason.
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("sandbox", "stages", "spade_cli")  # the floors, lowest first
SEALED = ("stages.train",)
# (importing module, imported module) -> why it may go past the door; none so far
ALLOWED: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the module it loads: a module of ours, or the package a name comes from
    line: int
    top_level: bool  # runs when `source` is imported (not in a function, not typing-only)
    written: str  # the statement, as `ast.unparse` gives it
    name: str | None = None  # `from target import name`: the name, when it is not a module


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted name -> file, for every module of PACKAGES (packages: folders with __init__.py)."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            folders = [root.joinpath(*parts[:i]) for i in range(1, len(parts))]
            if all((folder / "__init__.py").is_file() for folder in folders):
                name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
                found[name] = path
    return found


def package_of(name: str, known: dict[str, Path]) -> str:
    """The package a module sits in (a package is its own)."""
    return name if known[name].name == "__init__.py" else name.rpartition(".")[0] or name


def scan(root: Path = ROOT) -> list[Import]:
    """Every import of a module of ours by a module of ours."""
    known = modules(root)
    found: list[Import] = []
    for source, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        base = package_of(source, known)
        for node, top in _imports(tree.body, True):
            found += _resolve(node, top, source, base, known)
    return found


def _imports(body: list[ast.AST], top: bool):
    """(import statement, whether it is module level) under `body`."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, top
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield from _imports(node.body, False)
        elif isinstance(node, ast.If) and _typing_only(node.test):
            yield from _imports(node.body, False)
            yield from _imports(node.orelse, top)
        else:  # a class body, try, with, if, ...: runs when its module does
            yield from _imports(list(ast.iter_child_nodes(node)), top)


def _typing_only(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _resolve(node, top: bool, source: str, base: str, known: dict[str, Path]) -> list[Import]:
    written = ast.unparse(node)
    if isinstance(node, ast.Import):
        return [Import(source, _longest(alias.name, known), node.lineno, top, written)
                for alias in node.names if _longest(alias.name, known)]
    if node.level:  # relative: from the package `level` folders up
        parts = base.split(".")
        stem = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module
                                                                 else []))
    else:
        stem = node.module or ""
    out = []
    for alias in node.names:
        if f"{stem}.{alias.name}" in known:
            out.append(Import(source, f"{stem}.{alias.name}", node.lineno, top, written))
        elif _longest(stem, known):
            out.append(Import(source, _longest(stem, known), node.lineno, top, written,
                              alias.name))
    return out


def _longest(name: str, known: dict[str, Path]) -> str | None:
    """`name`, or its longest prefix that is a module of ours; None: not ours."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        if ".".join(parts[:end]) in known:
            return ".".join(parts[:end])
    return None


def cycles(found: list[Import]) -> list[list[str]]:
    """One cycle (its modules in order) per strongly connected group of module-level imports."""
    graph: dict[str, set[str]] = {}
    for imp in found:
        if imp.top_level and imp.target != imp.source:
            graph.setdefault(imp.source, set()).add(imp.target)
            graph.setdefault(imp.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph) + 100))
    try:
        for node in sorted(graph):
            if node not in index:
                visit(node)
    finally:
        sys.setrecursionlimit(limit)
    return [_a_cycle(sorted(group), graph) for group in groups]


def _a_cycle(group: list[str], graph: dict[str, set[str]]) -> list[str]:
    """A shortest cycle through the group's first module, within the group."""
    start, members = group[0], set(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & members):
                if nxt == start:
                    return paths[node]
                if nxt not in paths:
                    paths[nxt] = paths[node] + [nxt]
                    following.append(nxt)
        frontier = following
    return group


def floor(name: str) -> int:
    return PACKAGES.index(name.split(".")[0])


def imports_up(found: list[Import]) -> list[Import]:
    """Imports of a higher floor (stages by sandbox; spade_cli by either), anywhere."""
    return [imp for imp in found if floor(imp.target) > floor(imp.source)]


def door(package: str, root: Path = ROOT) -> list[str]:
    """What `package` lets in: the names of its `__all__`."""
    init = root.joinpath(*package.split("."), "__init__.py")
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    return []


def past_the_door(found: list[Import], root: Path = ROOT) -> list[tuple[Import, str]]:
    """Imports from outside a sealed package of one of its modules by its own path, or of a
    name its `__all__` does not give; each with what is wrong."""
    out = []
    for package in SEALED:
        names = door(package, root)
        for imp in found:
            inside = imp.source == package or imp.source.startswith(package + ".")
            if inside or (imp.source, imp.target) in ALLOWED or not (
                    imp.target == package or imp.target.startswith(package + ".")):
                continue
            sub = imp.target.removeprefix(package + ".") if imp.target != package else None
            through = imp.written.startswith(f"from {package} import ")
            if sub is not None and not (through and sub in names):
                out.append((imp, f"imports {imp.target} by its own path: import it "
                                 f"through {package}"))
            elif sub is None and imp.name is not None and imp.name not in names:
                out.append((imp, f"{imp.name} is not in {package}.__all__"))
    return out


def picture(found: list[Import], root: Path = ROOT) -> str:
    known = modules(root)
    counts = Counter(package_of(name, known) for name in known)
    top: dict[str, set[str]] = {p: set() for p in counts}
    lazy: dict[str, set[str]] = {p: set() for p in counts}
    for imp in found:
        source, target = package_of(imp.source, known), package_of(imp.target, known)
        if source != target:
            (top if imp.top_level else lazy)[source].add(target)
    width = max(map(len, counts))
    lines = [f"{'package':<{width}}  modules  imports (module level; then only in functions)"]
    for package in sorted(counts):
        only_lazy = sorted(lazy[package] - top[package])
        imported = ", ".join(sorted(top[package])) or "-"
        lines.append(f"{package:<{width}}  {counts[package]:>7}  {imported}"
                     + (f"; in functions: {', '.join(only_lazy)}" if only_lazy else ""))
    return "\n".join(lines)


def main(root: Path = ROOT) -> int:
    found = scan(root)
    loops, up, past = cycles(found), imports_up(found), past_the_door(found, root)
    print(picture(found, root))
    print(f"cycles: {len(loops)}, imports up: {len(up)}")
    print(f"past the door of {', '.join(SEALED)}: {len(past)}")
    for loop in loops:
        print("  cycle: " + " -> ".join(loop + loop[:1]))
    for imp in up:
        print(f"  up: {imp.source}:{imp.line} {imp.written}")
    for imp, why in past:
        print(f"  past the door: {imp.source}:{imp.line} {imp.written}: {why}")
    return 1 if loops or up or past else 0


if __name__ == "__main__":
    sys.exit(main())
