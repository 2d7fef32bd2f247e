"""Evaluation: plain, chain and tree speculative decoding (greedy or sampled), acceptance
metrics in every convention, peers, prompts, and scoring.

The names below load on first use (PEP 562): the readers of finished runs (`speclab runs`,
the dashboard) import `speclab.eval.paired`, which needs numpy only, and must not pay for
torch's import through this package's own.
"""

from __future__ import annotations

import importlib

_HOMES = {
    "hf_generate_tok_s": "benchmark", "score": "benchmark",
    "Generation": "engine", "effective_draft_len": "engine", "generate_plain": "engine",
    "generate_speculative": "engine",
    "AcceptanceStats": "metrics", "RequestRecord": "metrics", "acceptance_conventions": "metrics",
    "bootstrap_ci": "metrics", "speedups": "metrics", "timing": "metrics",
    "encode_prompt": "prompts", "humaneval_prompts": "prompts", "load_prompts": "prompts",
    "SamplingConfig": "sampling", "TokenChooser": "sampling",
    "TreeConfig": "tree", "draft_tree": "tree", "generate_tree": "tree",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_HOMES[name]}", __name__), name)
