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

RUN_SPECULATOR = Path("checkpoints") / "speculator"  # where a completed run keeps its weights
START_FILE = "init_from.json"  # in the warm run's directory: the directory and sha256 it started from


def saved_speculator_dir(path: str | Path) -> Path:
    """The speculator directory `path` names: itself, or a run directory's saved speculator."""
    path = Path(path)
    for candidate in (path, path / RUN_SPECULATOR):
        if (candidate / "config.json").is_file() and (candidate / "model.safetensors").is_file():
            return candidate
    raise FileNotFoundError(f"training.init_from={str(path)!r}: no trained speculator there (needs config.json and "
                            f"model.safetensors, in it or in its {RUN_SPECULATOR})")


def saved_family(path: str | Path) -> tuple[Path, str, tuple[int, int]]:
    """The saved speculator at `path`: its directory, family and target (vocab, hidden) sizes,
    read from its config.json as plain values (the config check calls this before any work)."""
    found = saved_speculator_dir(path)
    try:
        meta = json.loads((found / "config.json").read_text())
        return found, str(meta["family"]), (int(meta["target"]["vocab_size"]), int(meta["target"]["hidden_size"]))
    except Exception as exc:
        raise ValueError(f"training.init_from: corrupt speculator config {found / 'config.json'}: {exc}") from exc


def check_family(path: str | Path, family: str) -> Path:
    """The saved speculator's directory, if it is of `family`; else a ValueError naming both."""
    found, saved, _ = saved_family(path)
    if saved != family:
        raise ValueError(f"training.init_from: {found} holds a {saved} speculator; this run trains {family}")
    return found


def describe_start(path: str | Path) -> dict:
    """What result.json records of a warm start: the speculator directory and the sha256 of
    its weights file, read as the weights load (`begin_warm`)."""
    weights = saved_speculator_dir(path) / "model.safetensors"
    return {"path": str(weights.parent), "weights_sha256": hashlib.sha256(weights.read_bytes()).hexdigest()}


def warm_start(speculator: Speculator, path: str | Path) -> None:
    """Load the weights saved at `path` into `speculator` in place, or raise naming why not."""
    from safetensors.torch import load_model

    found = check_family(path, speculator.family)
    _, _, sizes = saved_family(found)
    info = speculator.target_info
    if sizes != (info.vocab_size, info.hidden_size):
        raise ValueError(f"training.init_from: {found} was trained for a target with vocab {sizes[0]} and hidden "
                         f"{sizes[1]}; this run's has {info.vocab_size} and {info.hidden_size}")
    weights = found / "model.safetensors"
    first = next(speculator.parameters(), None)
    try:
        load_model(speculator, str(weights), strict=True, device=str(first.device if first is not None else "cpu"))
    except Exception as exc:  # a missing or extra tensor, a shape, a truncated file
        raise ValueError(f"training.init_from: {weights} does not fit this run's {speculator.family} speculator "
                         f"(its config must build the same tensors): {exc}") from exc


def begin_warm(speculator: Speculator, path: str | Path, run_dir: str | Path) -> None:
    """A fresh warm run's start: the weights loaded, and what they were written to run_dir."""
    from .checkpoint import write_json_atomic
    from .ranks import is_writer

    warm_start(speculator, path)
    if is_writer():
        write_json_atomic(Path(run_dir) / START_FILE, describe_start(path))


def recorded_start(run_dir: str | Path) -> dict | None:
    """What a warm run started from (`begin_warm`'s record), or None for a run that did not."""
    record = Path(run_dir) / START_FILE
    return json.loads(record.read_text()) if record.is_file() else None
