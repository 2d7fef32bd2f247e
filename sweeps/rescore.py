"""Rescoring means what the first scoring meant: the drafting method a run or an export was
scored with, read back for `speclab eval`.

A run's result.json records the method its scoring chose (eval/method.py: a chain of k, or
a tree of a shape, depth, top_k and budget); an export carries a byte-for-byte copy of that
result.json. `speclab eval` drafts the same way unless `--k` asks for a chain, and says
which method it used and where it came from. result.json is data from a stranger: every
field is checked before it becomes a TreeConfig.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from speclab.eval.tree import TreeConfig

from .export import DEFAULT_K, scored_with
from .results import RESULT_FILE, read_result


@dataclass(frozen=True)
class Method:
    k: int  # a chain's length, or the tree's depth
    tree: TreeConfig | None
    source: str  # where it came from, for the report

    def describe(self) -> str:
        t = self.tree
        shape = f"tree {t.shape} depth {t.depth} top_k {t.top_k} budget {t.budget}" if t else f"chain k={self.k}"
        return f"{shape} ({self.source})"

    def as_json(self) -> dict:
        t = self.tree
        return {"kind": "tree", "shape": t.shape, "depth": t.depth, "top_k": t.top_k, "budget": t.budget,
                "source": self.source} if t else {"kind": "chain", "k": self.k, "source": self.source}


def eval_method(given: Path, checkpoint: Path, k: int | None) -> Method:
    """--k when given; else the method recorded beside the checkpoint; else a chain of DEFAULT_K."""
    if k is not None:
        return Method(k, None, "--k")
    result_dir = next((d for d in (given, checkpoint, checkpoint.parent, checkpoint.parent.parent)
                       if (d / RESULT_FILE).is_file()), None)
    if result_dir is None:
        return Method(DEFAULT_K, None, f"default: no {RESULT_FILE} records a method")
    path = result_dir / RESULT_FILE
    try:
        depth, tree = scored_with(read_result(result_dir))
        method = Method(_positive(depth, "k"), _tree(tree), f"as scored: {path}")
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: its recorded method is malformed ({exc}); pass --k to score a chain") from None
    return method


def _positive(value, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def _tree(tree: dict | None) -> TreeConfig | None:
    if tree is None:
        return None
    if not isinstance(tree.get("shape"), str):
        raise ValueError(f"tree shape must be a string, got {tree.get('shape')!r}")
    return TreeConfig(tree["shape"], *(_positive(tree[key], key) for key in ("depth", "top_k", "budget")))
