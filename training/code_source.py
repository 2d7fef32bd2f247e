"""Python source that every machine running speclab has: prompts and a corpus, no download.

The roots are the interpreter's standard library and its installed packages (or a folder
the user names). Files are visited in a seeded order, `sha256(seed, relative path)`, so a
prefix of the order is a fair sample of all of them and a longer build extends a shorter
one instead of reshuffling it.

`mine_prompts` turns documented public functions into HumanEval-style prompts: the
signature and the docstring, nothing of the body, the form HumanEval's prompts (the eval's
code set) have, so the target answers them as it answers the eval. A function whose name
or stub appears in an excluded text (the eval's prompts) is never mined.
"""

from __future__ import annotations

import ast
import hashlib
import re
import sys
import sysconfig
import warnings
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from .data_sources import normalise

# Folders never visited: test suites (assertion scaffolding, not code a user asks for),
# bytecode caches, and the stdlib's own site-packages (already a root when it is one).
_SKIPPED_PARTS = {"test", "tests", "testing", "__pycache__", "site-packages", "idle_test"}
# Docstrings outside this range are a one-line label or a manual page, not a task.
MIN_DOC_CHARS, MAX_DOC_CHARS = 40, 1200
PER_FILE = 4  # at most this many prompts per file, so one large module does not dominate
_DEF_NAME = re.compile(r"\bdef\s+([A-Za-z_]\w*)\s*\(")


def default_roots() -> list[Path]:
    """The interpreter's standard library and its installed packages (pure and platform)."""
    paths = sysconfig.get_paths()
    return sorted({Path(paths[k]) for k in ("stdlib", "purelib", "platlib")})


def roots_of(path: str | None) -> list[Path]:
    if path in (None, ""):
        return default_roots()
    root = Path(path).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"data.path {str(root)!r} is not a folder of Python source")
    return [root]


def _rank(seed: int, name: str) -> str:
    return hashlib.sha256(f"{seed}\n{name}".encode()).hexdigest()


def python_files(roots: Sequence[Path], seed: int) -> list[tuple[Path, str]]:
    """(file, its name relative to its root) of every .py file under `roots`, in seeded order."""
    found: dict[str, Path] = {}
    for root in roots:
        for path in root.rglob("*.py"):
            rel = path.relative_to(root)
            if _SKIPPED_PARTS.isdisjoint(rel.parts[:-1]) and path.is_file():
                found.setdefault(f"{root.name}/{rel.as_posix()}", path)
    return [(found[name], name) for name in sorted(found, key=lambda n: _rank(seed, n))]


def listing_fingerprint(roots: Sequence[Path]) -> str:
    """Names and sizes of the files under `roots` plus the interpreter's version: what the
    mined data depends on, without reading tens of thousands of files. Listed once per process
    (the installed source does not change under a running experiment)."""
    return _listing_fingerprint(tuple(roots))


@lru_cache(maxsize=8)
def _listing_fingerprint(roots: tuple[Path, ...]) -> str:
    h = hashlib.sha256(sys.version.encode())
    for path, name in sorted(python_files(roots, 0), key=lambda f: f[1]):
        h.update(f"{name}\0{path.stat().st_size}\n".encode())
    return h.hexdigest()


def read_source(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def excluded_names(texts: Iterable[str]) -> set[str]:
    """Every function name defined in `texts` (HumanEval's entry points and helpers)."""
    return {m.group(1) for text in texts for m in _DEF_NAME.finditer(text)}


def function_stub(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    """`def name(args) -> ret:` plus its docstring: a HumanEval-style prompt, or None."""
    doc = ast.get_docstring(node, clean=True)
    if node.name.startswith("_") or doc is None or not MIN_DOC_CHARS <= len(doc) <= MAX_DOC_CHARS:
        return None
    stub = ast.FunctionDef(name=node.name, args=node.args, body=[ast.Expr(ast.Constant(doc))],
                           decorator_list=[], returns=node.returns, type_comment=None, type_params=[])
    text = ast.unparse(ast.fix_missing_locations(stub))
    # ast.unparse writes the docstring as one repr'd line; HumanEval indents it as a block.
    head = text.split("\n", 1)[0]
    body = "\n".join(("    " + line).rstrip() for line in doc.splitlines())
    return f'{head}\n    """\n{body}\n    """\n'


def _stubs(source: str) -> Iterator[tuple[str, str]]:
    """(function name, stub) of module-level functions (HumanEval asks for functions, and a
    method without its class is a task with half its context missing)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # invalid escape sequences in old modules
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError, RecursionError):
            return
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            stub = function_stub(node)
            if stub is not None:
                yield node.name, stub


def mine_prompts(roots: Sequence[Path], seed: int, exclude: Sequence[str] = ()) -> Iterator[str]:
    """HumanEval-style prompts from the files under `roots`, in seeded file order, deduplicated
    (case and whitespace do not make a new prompt); never a name or stub found in `exclude`."""
    names = excluded_names(exclude)
    excluded_text = [normalise(t) for t in exclude]
    seen: set[str] = set()
    for path, _ in python_files(roots, seed):
        source = read_source(path)
        if source is None:
            continue
        taken = 0
        for name, stub in _stubs(source):
            key = normalise(stub)
            if name in names or key in seen or any(key in t for t in excluded_text):
                continue
            seen.add(key)
            yield stub
            taken += 1
            if taken == PER_FILE:
                break


class PromptMiner:
    """`mine_prompts` kept in memory per process, so the rounds of a growing build (and a
    fingerprint then a build) do not parse the same files again."""

    _cache: dict[tuple, "PromptMiner"] = {}

    def __init__(self, roots: Sequence[Path], seed: int, exclude: Sequence[str]):
        self._items: list[str] = []
        self._source = mine_prompts(roots, seed, exclude)

    @classmethod
    def of(cls, roots: Sequence[Path], seed: int, exclude: Sequence[str]) -> "PromptMiner":
        key = (tuple(map(str, roots)), seed, hashlib.sha256("\0".join(exclude).encode()).hexdigest())
        if key not in cls._cache:
            cls._cache[key] = cls(roots, seed, exclude)
        return cls._cache[key]

    def take(self, start: int, count: int) -> list[str]:
        """Prompts start..start+count-1 of the mined order (fewer if the source runs dry)."""
        while len(self._items) < start + count:
            item = next(self._source, None)
            if item is None:
                break
            self._items.append(item)
        return self._items[start : start + count]
