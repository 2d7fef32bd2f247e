"""Speculator options under an old name: refused with the new one (no torch: the CLI checks
overrides with it before anything heavy loads)."""

from __future__ import annotations

from typing import Any

# Options renamed so that one concept has one name across families: chain length is
# `n_predict` everywhere (`num_heads` means attention heads in draft_lm and eagle), and
# `tie_weights` is a bool everywhere (lstm's "shared" | "per_stage" was the same choice). An
# old name is refused with the new one, never remapped: a config built on the old meaning
# must be rewritten on purpose (sweep files, command lines and saved checkpoints alike).
# Decided for stored runs: anything that builds a model from a stored config (export, eval,
# a resumed training attempt) refuses an old name in one line; `speclab runs` and the
# dashboard read a result's family and figures, never its options, so old runs still list.
# An old run's config hash differs from its renamed twin's, so a sweep reruns it.
RENAMED: dict[str, dict[str, str]] = {
    "medusa": {"num_heads": "n_predict"},
    "hydra": {"num_heads": "n_predict"},
}
RETYPED: dict[tuple[str, str], dict[Any, bool]] = {
    ("lstm", "tie_weights"): {"shared": True, "per_stage": False},
}


def check_renamed(family: str, params: dict, where: str = "speculator") -> None:
    """Raise a one-line ValueError for an option under its old name or of its old type."""
    for old, new in RENAMED.get(family, {}).items():
        if old in params:
            raise ValueError(f"{where}.{old} was renamed: {family} takes {where}.{new} (the longest draft chain)")
    for (fam, key), values in RETYPED.items():
        if fam == family and isinstance(params.get(key), str) and params[key] in values:
            raise ValueError(f"{where}.{key}={params[key]} is now a bool: {where}.{key}="
                             f"{str(values[params[key]]).lower()}")
