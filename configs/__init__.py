"""Hydra's config package. Importing it (Hydra does, to read the YAML) registers the typed
schemas the YAML files override (`schemas.py`): every default is declared once, in a dataclass."""

from .schemas import register

register()
