"""Imports every family module so that each registers itself."""

from . import draft_lm, mlp  # noqa: F401
