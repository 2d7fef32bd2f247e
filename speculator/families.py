"""Imports every family module so that each registers itself."""

from . import draft_lm, eagle, eagle3, hybrid, hydra, lstm, medusa, mlp, ngram, suffix  # noqa: F401
