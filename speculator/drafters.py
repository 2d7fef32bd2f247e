"""The families that draft alone: every registered family but `hybrid`.

hybrid.py builds its two parts (a learned family and the suffix drafter) from this table,
and the registry (families.py) is this table plus hybrid; so hybrid needs nothing of the
registry, and neither imports the other.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .base import Speculator
from .dflash import DFlashSpeculator
from .dflash2 import DFlash2Speculator
from .dspark import DSparkSpeculator
from .draft_lm import DraftLM
from .eagle import EagleSpeculator
from .eagle3 import Eagle3Speculator
from .hydra import HydraSpeculator
from .lstm import LSTMSpeculator
from .medusa import MedusaSpeculator
from .mlp import MLPSpeculator
from .ngram import NgramSpeculator
from .peagle import PEagleSpeculator
from .renamed import check_renamed
from .suffix import SuffixSpeculator
from .xpress import XPressSpeculator

DRAFTERS: dict[str, type[Speculator]] = {cls.family: cls for cls in (
    DFlashSpeculator, DFlash2Speculator, DSparkSpeculator, DraftLM, EagleSpeculator, Eagle3Speculator, HydraSpeculator, LSTMSpeculator,
    MedusaSpeculator, MLPSpeculator, NgramSpeculator, PEagleSpeculator, SuffixSpeculator, XPressSpeculator,
)}


def config_of(cls: type[Speculator], params: dict) -> Any:
    """`cls`'s config from plain options, refusing a renamed option (naming its new name, in
    one line) and an option it does not have."""
    check_renamed(cls.family, params)
    names = {f.name for f in dataclasses.fields(cls.Config)}
    unknown = sorted(set(params) - names)
    if unknown:
        raise ValueError(f"unknown {cls.family} speculator option(s) {unknown}; valid: {sorted(names)}")
    return cls.Config(**params)
