"""speclab's description of a checkpoint, read as JSON: its config.json, or an export's
speclab.json. Reading it needs nothing of the export layouts, so target_spec.py (which
names a checkpoint's target) and export_formats.py (which loads its weights) both read it
from here."""

from __future__ import annotations

import json
from pathlib import Path

SPECLAB_META = "speclab.json"  # speclab's description of a foreign-layout export


def checkpoint_meta(path: str | Path) -> dict:
    """speclab's description of a checkpoint: its config.json, or an export's speclab.json."""
    path = Path(path)
    meta_file = path / SPECLAB_META if (path / SPECLAB_META).is_file() else path / "config.json"
    return json.loads(meta_file.read_text())
