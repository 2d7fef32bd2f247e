"""The registry: every speculator family by name, and building or loading one by name.

The table below is the registry, written out: a family is registered by importing its
class here (a family that drafts alone: in drafters.py's `DRAFTERS`) and adding it to the
table. Family modules import `base` (the interfaces), never this module, and `base`
imports no family; hybrid builds its parts from `DRAFTERS`, below this module, so nothing
imports in a circle.
`configs/speculator/<name>.yaml` maps one-to-one onto this table (tests/speculator).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from safetensors.torch import load_model

from .base import Speculator, TargetInfo, target_device
from .drafters import DRAFTERS, config_of
from .hybrid import HybridSpeculator

REGISTRY: dict[str, type[Speculator]] = dict(sorted({**DRAFTERS, HybridSpeculator.family: HybridSpeculator}.items()))


def speculator_class(family: str) -> type[Speculator]:
    if family not in REGISTRY:
        raise ValueError(f"unknown speculator family {family!r}; valid: {sorted(REGISTRY)}")
    return REGISTRY[family]


def build_config(family: str, params: dict) -> Any:
    return config_of(speculator_class(family), params)


def build_speculator(family: str, params: dict, target: TargetInfo) -> Speculator:
    return speculator_class(family)(build_config(family, params), target)


def load_speculator(path: str | Path, target: TargetInfo | None = None) -> Speculator:
    """Load a saved speculator directory (safetensors + config.json; never a pickle)."""
    path = Path(path)
    cfg_file, weights = path / "config.json", path / "model.safetensors"
    if not cfg_file.is_file() or not weights.is_file():
        raise FileNotFoundError(f"{path} is not a speculator checkpoint: needs config.json and model.safetensors")
    try:
        meta = json.loads(cfg_file.read_text())
        saved = TargetInfo(**meta["target"])
    except Exception as exc:
        raise ValueError(f"corrupt speculator checkpoint {path}: config.json: {exc}") from exc
    if target is not None and (target.vocab_size, target.hidden_size) != (saved.vocab_size, saved.hidden_size):
        raise ValueError(f"{path} was trained for target {saved.name} "
                         f"(vocab {saved.vocab_size}, hidden {saved.hidden_size}), not {target.name}")
    # Built from the saved description (no embedding): the weights overwrite any init.
    needs = speculator_class(meta["family"]).target_tensors
    if needs and target is None:
        raise ValueError(f"{path}: a {meta['family']} speculator drafts through its target's frozen "
                         f"{', '.join(needs)}; pass the live target: load_speculator(path, TargetInfo.of(target))")
    saved = dataclasses.replace(saved, **{name: getattr(target, name) for name in needs})
    model = build_speculator(meta["family"], meta["config"], saved)
    try:
        load_model(model, str(weights), device=str(target_device(target)))
    except Exception as exc:
        raise ValueError(f"corrupt speculator checkpoint {path}: {exc}") from exc
    return model.eval()
