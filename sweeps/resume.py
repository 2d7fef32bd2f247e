"""Resuming a sweep: skip the runs already completed with the same resolved config.

A run is identified by a hash of its resolved config minus the keys that only say where
it runs or how it is reported (`LOCATION_KEYS`): the same experiment started from another
sweep directory, or with wandb online instead of offline, is the same experiment. The
run directories are the only record (docs/design.md), so the lookup scans every result.json under
runs_dir; a failed run, or one killed before it wrote result.json, is simply not found and
runs again. Killing a sweep cannot lose a completed run: its result.json was written
atomically as its last act and nothing here ever deletes or rewrites one.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any, Mapping

from .run_rows import find_run_dirs
from .results import RESULT_FILE, read_result

log = logging.getLogger(__name__)

# Top-level config keys that do not change what a run computes: where its directory goes
# (runs_dir, run_name, which embeds a timestamp), the resume policy itself, and reporting.
LOCATION_KEYS = frozenset({"runs_dir", "run_name", "resume", "wandb", "hydra"})


# Training keys added after runs existed, left out of the hash while unset (null), so a
# run from before a key was added keeps its identity and is still found when resumed.
LATER_TRAINING_KEYS = frozenset({"init_from"})


def config_hash(config: Mapping[str, Any]) -> str:
    """sha256 of the resolved config (a plain dict), location keys excluded, keys sorted."""
    kept = {key: value for key, value in config.items() if key not in LOCATION_KEYS}
    training = kept.get("training")
    if isinstance(training, Mapping):
        kept["training"] = {key: value for key, value in training.items()
                            if not (key in LATER_TRAINING_KEYS and value is None)}
    text = json.dumps(kept, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def digest(text: str, length: int = 8) -> str:
    """A short stable name for a string (used in run-directory names: the job's overrides)."""
    return hashlib.sha256(str(text).encode()).hexdigest()[:length]


def find_completed(runs_dir: str | Path, wanted_hash: str) -> Path | None:
    """The run directory under runs_dir whose completed result.json has this config hash."""
    root = Path(runs_dir)
    if not root.is_dir():
        return None
    for run_dir in find_run_dirs(root):
        try:
            result = read_result(run_dir)
        except ValueError:  # a damaged record does not count as done
            continue
        if result.get("status") == "completed" and isinstance(result.get("config"), dict) \
                and config_hash(result["config"]) == wanted_hash:
            return run_dir
    return None


def check_run_dir_free(run_dir: Path, wanted_hash: str) -> None:
    """Refuse to overwrite another config's completed run in this directory.

    Run-directory names come from the job's overrides, so they only collide when the sweep's
    base config changed between two launches; the old result then stays untouched.
    """
    if not (run_dir / RESULT_FILE).is_file():
        return
    try:
        result = read_result(run_dir)
    except ValueError:
        return
    if result.get("status") == "completed" and isinstance(result.get("config"), dict) \
            and config_hash(result["config"]) != wanted_hash:
        raise FileExistsError(f"{run_dir} holds a completed run of another config; "
                              "give the sweep another hydra.sweep.dir to keep both")
