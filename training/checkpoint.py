"""Checkpoints for exact resumption: one directory per step, complete only once marked.

A checkpoint is a dict of stateful things plus the config (torchtitan's `states=`):
model, optimizer, LR scheduler, the run's loop state (step, data position, loss
history, the watchdog's window), RNG states and the resolved config. Writing it:

1. every file goes into `.tmp-step-N-<pid>/`, each written and fsynced;
2. the temp directory is fsynced and renamed to `step-N/`, and the parent fsynced;
3. only then `COMPLETE.json` (the step and each file's sha256) is written into it,
   itself atomically (temp file, fsync, rename).

A directory without the marker is garbage from a crash and is never read. Loading
verifies the marker and every checksum and falls back to the previous complete
checkpoint when they fail; a failed one is renamed `corrupt-step-N` and kept for a post
mortem. Retention keeps the newest `keep_last` plus the newest `keep_anchors` whose step
is a multiple of `anchor_every_n_steps` (step 0, the initial state, counts as one), so a
rollback can reach back past a spike that began before the newest few.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from speclab.kernels.util import cache_lock

log = logging.getLogger(__name__)

MARKER = "COMPLETE.json"
FILES = ("model.pt", "optimizer.pt", "scheduler.pt", "loop.pt", "rng.pt", "config.json")


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (disk full, read-only, ...): the run must stop."""


@dataclass
class CheckpointConfig:
    """Cadence and retention of a run's checkpoints (training config keys `checkpoint_*`)."""

    every_n_steps: int = 100
    """Save after every this many optimiser steps (and always at step 0 and the last step)."""
    keep_last: int = 3
    """The newest checkpoints kept."""
    anchor_every_n_steps: int = 500
    """Checkpoints at multiples of this are anchors, kept longer for rolling back past a spike."""
    keep_anchors: int = 2
    """The newest anchors kept, on top of `keep_last`."""

    @classmethod
    def from_training(cls, cfg) -> "CheckpointConfig":
        return cls(cfg.checkpoint_every_n_steps, cfg.checkpoint_keep_last,
                   cfg.checkpoint_anchor_every_n_steps, cfg.checkpoint_keep_anchors)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _write_file(path: Path, data: bytes) -> None:
    """Write and fsync one file (tests replace this to simulate a full disk)."""
    cache_lock.write_file(path, data)


def write_json_atomic(path: Path, data) -> None:
    cache_lock.write_atomic(path, json.dumps(data, indent=1).encode())


def _to_bytes(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def complete_steps(root: Path) -> list[int]:
    """Steps of the marked (not yet verified) checkpoints under root, ascending."""
    if not root.is_dir():
        return []
    return sorted(int(p.name[5:]) for p in root.glob("step-*") if (p / MARKER).is_file())


class CheckpointStore:
    """The checkpoints of one run, under `root`."""

    def __init__(self, root: Path, cfg: CheckpointConfig):
        self.root, self.cfg = Path(root), cfg

    def clean_partial(self) -> None:
        """Remove temp directories and unmarked step directories left by a crash."""
        for p in list(self.root.glob(".tmp-step-*")) + [p for p in self.root.glob("step-*") if not (p / MARKER).is_file()]:
            shutil.rmtree(p, ignore_errors=True)

    def save(self, step: int, states: dict[str, object], config: dict | None = None) -> Path:
        """Write checkpoint `step` (states: model, optimizer, scheduler, loop, rng)."""
        blobs = {f"{name}.pt": _to_bytes(value) for name, value in states.items()}
        blobs["config.json"] = json.dumps(config or {}, sort_keys=True, default=str).encode()
        tmp = self.root / f".tmp-{step_dir_name(step)}-{os.getpid()}"
        final = self.root / step_dir_name(step)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            for name, data in blobs.items():
                _write_file(tmp / name, data)
            cache_lock.fsync_dir(tmp)
            if final.exists():  # an abandoned timeline's step of the same number
                shutil.rmtree(final)
            os.rename(tmp, final)
            cache_lock.fsync_dir(self.root)
            write_json_atomic(final / MARKER, {"step": step, "files": {n: _sha256(d) for n, d in blobs.items()}})
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if final.exists() and not (final / MARKER).is_file():
                shutil.rmtree(final, ignore_errors=True)
            raise CheckpointWriteError(exc.errno, f"checkpoint step {step} could not be written under "
                                                  f"{self.root}: {exc.strerror or exc}") from exc
        self.prune()
        return final

    def load(self, step: int) -> dict:
        """Read and verify checkpoint `step`; raises ValueError when it is damaged."""
        path = self.root / step_dir_name(step)
        marker = json.loads((path / MARKER).read_text())
        if marker.get("step") != step or set(marker.get("files", {})) != set(FILES):
            raise ValueError(f"{path}: marker does not match the checkpoint")
        out: dict = {"step": step}
        for name, digest in marker["files"].items():
            data = (path / name).read_bytes()
            if _sha256(data) != digest:
                raise ValueError(f"{path / name}: checksum mismatch")
            key = name.rsplit(".", 1)[0]
            out[key] = json.loads(data) if name.endswith(".json") else torch.load(io.BytesIO(data), weights_only=True)
        return out

    def load_latest(self, before: int | None = None) -> dict | None:
        """The newest checkpoint that verifies (with step < `before`, if given), else None.

        A checkpoint that fails verification is quarantined and the previous one tried.
        """
        for step in reversed(complete_steps(self.root)):
            if before is not None and step >= before:
                continue
            try:
                return self.load(step)
            except Exception as exc:  # damaged bytes, a bad marker, an unreadable pickle
                log.warning("checkpoint step %d is damaged (%s); falling back to the previous one", step, exc)
                self._quarantine(step)
        return None

    def _quarantine(self, step: int) -> None:
        src = self.root / step_dir_name(step)
        dst = self.root / f"corrupt-{step_dir_name(step)}"
        shutil.rmtree(dst, ignore_errors=True)
        os.rename(src, dst)

    def drop_after(self, step: int) -> None:
        """Delete checkpoints newer than `step`: after a rollback they are an abandoned timeline."""
        for s in complete_steps(self.root):
            if s > step:
                path = self.root / step_dir_name(s)
                (path / MARKER).unlink()  # unmarked first: a crash mid-delete leaves garbage, not a checkpoint
                shutil.rmtree(path)

    def prune(self) -> None:
        steps = complete_steps(self.root)
        anchors = [s for s in steps if s % self.cfg.anchor_every_n_steps == 0]
        keep = set(steps[-self.cfg.keep_last :]) | set(anchors[-self.cfg.keep_anchors :] if self.cfg.keep_anchors else [])
        for s in steps:
            if s not in keep:
                path = self.root / step_dir_name(s)
                (path / MARKER).unlink()
                shutil.rmtree(path)


def final_weights(root: Path) -> dict[str, torch.Tensor]:
    """The model state dict of the newest checkpoint that verifies (a completed run's last step)."""
    newest = CheckpointStore(root, CheckpointConfig()).load_latest()
    if newest is None:
        raise FileNotFoundError(f"no complete checkpoint under {root}")
    return newest["model"]


