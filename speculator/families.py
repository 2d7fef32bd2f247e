"""Imports every family module so that each registers itself."""

from . import draft_lm, eagle, eagle3, hydra, lstm, medusa, mlp  # noqa: F401
