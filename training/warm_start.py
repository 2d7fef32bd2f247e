"""Warm start: a run's speculator begins from another run's trained weights.

`training.init_from=PATH` (a run directory, or a saved speculator directory: config.json and
model.safetensors) loads those weights into the freshly built speculator before its first
step. The optimizer, the learning-rate schedule (warm-up, then cosine) and the data order
start fresh: a run trained for two epochs goes on for a third as a run of its own, with its
own config hash and directory, and the first run is left as it was. Exact resume is
unchanged: a warm run saves its starting weights as step 0, and a restart resumes from its
own checkpoints without reading PATH again (it may have moved meanwhile). What it started
from is written beside them when the weights load (`START_FILE`), so result.json records it
whichever attempt finishes the run.

The saved config.json is data from a stranger: only its family and target sizes are
compared, as strings and numbers; nothing in it is built. The architecture is checked by the
weights themselves: every tensor the configured speculator has must be in the file with the
same shape, and the file may hold nothing else; a mismatch fails the run before its first
step, naming the tensors.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch loads only when weights do: the config check reads the directory alone
    from speclab.speculator.base import Speculator

START_FILE = "init_from.json"  # in the warm run's directory: the directory and sha256 it started from


def saved_family(found: Path) -> tuple[str, tuple[int, int]]:
    """A saved speculator directory's family and target (vocab, hidden) sizes, read from its
    config.json as plain values (the config check calls this before any work). The directory
    is found by the caller: a run directory is resolved by sweeps.results.find_speculator_checkpoint."""
    try:
        meta = json.loads((Path(found) / "config.json").read_text())
        return str(meta["family"]), (int(meta["target"]["vocab_size"]), int(meta["target"]["hidden_size"]))
    except Exception as exc:
        raise ValueError(f"training.init_from: corrupt speculator config {Path(found) / 'config.json'}: {exc}") from exc


def check_family(found: Path, family: str) -> tuple[int, int]:
    """The saved speculator's target sizes, if it is of `family`; else a ValueError naming both."""
    saved, sizes = saved_family(found)
    if saved != family:
        raise ValueError(f"training.init_from: {found} holds a {saved} speculator; this run trains {family}")
    return sizes


def describe_start(found: Path) -> dict:
    """What result.json records of a warm start: the speculator directory and the sha256 of
    its weights file, read as the weights load (`begin_warm`)."""
    weights = Path(found) / "model.safetensors"
    return {"path": str(found), "weights_sha256": hashlib.sha256(weights.read_bytes()).hexdigest()}


def warm_start(speculator: Speculator, found: Path) -> None:
    """Load the weights saved in the speculator directory `found` into `speculator` in place,
    or raise naming why not."""
    from safetensors.torch import load_model

    sizes = check_family(found, speculator.family)
    info = speculator.target_info
    if sizes != (info.vocab_size, info.hidden_size):
        raise ValueError(f"training.init_from: {found} was trained for a target with vocab {sizes[0]} and hidden "
                         f"{sizes[1]}; this run's has {info.vocab_size} and {info.hidden_size}")
    weights = Path(found) / "model.safetensors"
    first = next(speculator.parameters(), None)
    try:
        load_model(speculator, str(weights), strict=True, device=str(first.device if first is not None else "cpu"))
    except Exception as exc:  # a missing or extra tensor, a shape, a truncated file
        raise ValueError(f"training.init_from: {weights} does not fit this run's {speculator.family} speculator "
                         f"(its config must build the same tensors): {exc}") from exc


def begin_warm(speculator: Speculator, found: Path, run_dir: str | Path) -> None:
    """A fresh warm run's start: the weights loaded, and what they were written to run_dir."""
    from .checkpoint import write_json_atomic
    from .ranks import is_writer

    warm_start(speculator, found)
    if is_writer():
        write_json_atomic(Path(run_dir) / START_FILE, describe_start(found))


def recorded_start(run_dir: str | Path) -> dict | None:
    """What a warm run started from (`begin_warm`'s record), or None for a run that did not."""
    record = Path(run_dir) / START_FILE
    return json.loads(record.read_text()) if record.is_file() else None
