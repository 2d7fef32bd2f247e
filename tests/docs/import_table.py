"""The import table of docs/design.md as data, and a checker that walks a source tree.

`ROOMS` is the one copy of the rules: each project room (a folder, or a sub-room named
by its path) and the rooms it may import besides itself. `check(tree)` parses every
module under the rooms with `ast`, resolves each import (top-level, inside functions,
relative) to a module of the project, and returns one line per upward import (file:line,
the import, the rule) and one per import cycle between modules. A sub-room is its own
room: `speculator/target` importing a family of `speculator` is upward.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

# room (folder path) -> rooms it may import besides itself; the most specific room wins
ROOMS: dict[str, tuple[str, ...]] = {
    "kernels": (),
    "speculator/target": ("kernels",),
    "speculator": ("speculator/target", "kernels"),
    "training": ("speculator", "speculator/target", "kernels"),
    "eval": ("speculator", "speculator/target", "kernels"),
    "sweeps": ("speculator", "speculator/target", "kernels", "training", "eval"),
}

# how the installed package names the folders (pyproject.toml's package-dir)
NAMESPACE = "speclab"
PACKAGE_ROOT = "sweeps/_namespace"  # the `speclab` package itself


@dataclass(frozen=True)
class Module:
    name: str  # dotted, e.g. speclab.speculator.mlp
    path: Path  # relative to the tree root
    is_package: bool


def room_of(path: Path) -> str | None:
    """The most specific room holding a file (a path relative to the tree root)."""
    text = path.as_posix()
    best = None
    for room in ROOMS:
        if text.startswith(room + "/") and (best is None or len(room) > len(best)):
            best = room
    return best


def _module_name(rel: Path) -> str:
    parts = list(rel.with_suffix("").parts)
    if rel.as_posix().startswith(PACKAGE_ROOT + "/"):
        parts = parts[len(Path(PACKAGE_ROOT).parts):]
    if parts and parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join([NAMESPACE] + parts)


def modules(tree: Path) -> dict[str, Module]:
    found = {}
    for room in ROOMS:
        folder = tree / room
        if not folder.is_dir():
            continue
        for file in sorted(folder.rglob("*.py")):
            rel = file.relative_to(tree)
            name = _module_name(rel)
            found[name] = Module(name, rel, file.name == "__init__.py")
    root_init = tree / PACKAGE_ROOT / "__init__.py"
    if root_init.is_file():
        found[NAMESPACE] = Module(NAMESPACE, root_init.relative_to(tree), True)
    return found


def _imported(node: ast.AST, module: Module, known: dict[str, Module]) -> list[str]:
    """The project modules one import statement names (the deepest that exists)."""
    if isinstance(node, ast.Import):
        candidates = [alias.name for alias in node.names]
    else:
        assert isinstance(node, ast.ImportFrom)
        if node.level:
            package = module.name.split(".")
            if not module.is_package:
                package = package[:-1]
            package = package[: len(package) - (node.level - 1)]
            base = ".".join(package + ([node.module] if node.module else []))
        else:
            base = node.module or ""
        # `from package import submodule` imports the submodule; any other name, the module
        candidates = [
            f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names
        ]
    names = []
    for candidate in candidates:
        parts = candidate.split(".")
        while parts and ".".join(parts) not in known:
            parts.pop()
        if parts and ".".join(parts) not in names:
            names.append(".".join(parts))
    return names


def edges(tree: Path) -> tuple[dict[str, Module], list[tuple[str, str, int]]]:
    known = modules(tree)
    found = []
    for module in known.values():
        source = (tree / module.path).read_text()
        for node in ast.walk(ast.parse(source, filename=str(module.path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _imported(node, module, known):
                    if target != module.name:
                        found.append((module.name, target, node.lineno))
    return known, found


def upward(tree: Path) -> list[str]:
    known, found = edges(tree)
    problems = []
    for source, target, line in found:
        src_room = room_of(known[source].path)
        dst_room = room_of(known[target].path) if target != NAMESPACE else None
        if src_room is None or dst_room is None or dst_room == src_room:
            continue
        if dst_room not in ROOMS[src_room]:
            allowed = ", ".join(ROOMS[src_room]) or "nothing of the project"
            problems.append(
                f"{known[source].path}:{line}: imports {target} ({dst_room}/); "
                f"rule: {src_room}/ may import {allowed}"
            )
    return problems


def cycles(tree: Path) -> list[str]:
    """Every strongly connected group of modules, reported as one cycle through it."""
    known, found = edges(tree)
    graph: dict[str, dict[str, int]] = {name: {} for name in known}
    for source, target, line in found:
        graph[source].setdefault(target, line)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan; the graph is small enough for recursion
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return [_one_cycle(sorted(group), graph, known) for group in groups]


def _one_cycle(group: list[str], graph: dict[str, dict[str, int]], known: dict[str, Module]) -> str:
    """A shortest path from the group's first module back to itself, with file:line."""
    start, members = group[0], set(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in graph[node]:
                if nxt == start:
                    path = paths[node] + [start]
                    hops = [f"{known[a].path}:{graph[a][b]}" for a, b in zip(path, path[1:])]
                    return "cycle: " + " -> ".join(path) + "  (" + ", ".join(hops) + ")"
                if nxt in members and nxt not in paths:
                    paths[nxt] = paths[node] + [nxt]
                    following.append(nxt)
        frontier = following
    return "cycle: " + ", ".join(group)


def check(tree: Path) -> list[str]:
    return upward(tree) + cycles(tree)


def docs_table(design_md: str) -> dict[str, frozenset[str]]:
    """The `may import` column of docs/design.md's folder table, for the rooms in ROOMS:
    the rooms it names in backticks (`everything`: every other room)."""
    table = {}
    for line in design_md.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not re.fullmatch(r"`[a-z_/]+`", cells[0]):
            continue
        room = cells[0].strip("`").rstrip("/")
        if room not in ROOMS:
            continue
        if cells[2].startswith("everything"):
            table[room] = frozenset(ROOMS) - {room}
        else:
            table[room] = frozenset(name.rstrip("/") for name in re.findall(r"`([a-z_/]+)`", cells[2]))
    return table


if __name__ == "__main__":
    import sys

    lines = check(Path(sys.argv[1] if len(sys.argv) > 1 else "."))
    print("\n".join(lines) or "no upward import, no cycle")
