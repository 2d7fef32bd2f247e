"""Fault injection (config group `faults/`): make a run fail on purpose, once, at a step.

Kinds, each at optimiser step `at_step` (1-based: the step being computed) and
micro-batch `at_micro_batch` of it (> 0 lands inside gradient accumulation):
- exception: raises `SimulatedDeviceError`, as a CUDA/XID error would surface;
- sigkill: the training process sends itself SIGKILL;
- hang: the process stops making progress (and stops its heartbeat);
- nan_loss: that step's loss becomes NaN;
- spike: the loss is multiplied by `spike_factor` for `spike_steps` steps;
- corrupt_checkpoint: the newest checkpoint's bytes are damaged, then a device error
  is raised, so the restart must detect the damage and fall back.

A fault fires once per run: before it fires it is recorded (fsynced) in the run's
`faults.json`, and a restarted or rolled-back attempt that replays the step finds the
record and lets it pass. `repeat: every_attempt` is the permanent variant (a broken
device), which fires again on every attempt, to test `max_restarts` and the rollback budget.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from lightning.pytorch.callbacks import Callback

from . import ranks
from .checkpoint import MARKER, complete_steps, step_dir_name, write_json_atomic

FaultKind = Literal["none", "exception", "sigkill", "hang", "nan_loss", "spike", "corrupt_checkpoint"]
FAULTS_FILE = "faults.json"


@dataclass
class FaultConfig:
    """One injected fault (config group `faults/`)."""

    kind: FaultKind = "none"
    """What goes wrong (see the module docstring); none: nothing."""
    at_step: int = 0
    """The optimiser step (1-based) during which it fires."""
    at_micro_batch: int = 0
    """Which micro-batch of that step (0: the first; > 0: inside gradient accumulation)."""
    rank: int = 0
    """Data-parallel runs: the rank (process) the fault fires on; the others run clean."""
    repeat: Literal["once", "every_attempt"] = "once"
    """once: fires once per run | every_attempt: again after each restart or rollback (permanent)."""
    spike_factor: float = 10.0
    """spike: the loss multiplier."""
    spike_steps: int = 5
    """spike: for how many steps."""


class SimulatedDeviceError(RuntimeError):
    """Stands in for a device error (CUDA illegal address, XID): the process is unusable."""


def fired(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / FAULTS_FILE
    return json.loads(path.read_text()) if path.is_file() else []


class FaultInjector(Callback):
    def __init__(self, cfg: FaultConfig, run_dir: Path, checkpoints: Path, accumulate: int):
        self.cfg, self.run_dir, self.checkpoints, self.accumulate = cfg, Path(run_dir), checkpoints, accumulate
        self.loop = None  # the run's LoopState (progress.py), set by the loop for each segment
        self.armed = False

    def begin_segment(self, loop) -> None:
        """Called before each fit (a fresh attempt or after a rollback)."""
        self.loop = loop
        self.armed = (self.cfg.kind != "none" and ranks.rank() == self.cfg.rank
                      and (self.cfg.repeat == "every_attempt" or not fired(self.run_dir)))
        self._firing = False

    def _record(self) -> None:
        record = {"kind": self.cfg.kind, "step": self.loop.step + 1, "micro_batch": self.cfg.at_micro_batch,
                  "rank": ranks.rank(), "time": time.time(), "pid": os.getpid()}
        write_json_atomic(self.run_dir / FAULTS_FILE, fired(self.run_dir) + [record])

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        module.loss_fault = None
        if not self.armed:
            return
        step, micro = self.loop.step + 1, batch_idx % self.accumulate
        if self.cfg.kind == "spike" and self.cfg.at_step <= step < self.cfg.at_step + self.cfg.spike_steps:
            if step == self.cfg.at_step and micro == 0 and not self._firing:
                self._record()
                self._firing = True
            if self._firing:
                module.loss_fault = lambda loss: loss * self.cfg.spike_factor
            return
        if step != self.cfg.at_step or micro != self.cfg.at_micro_batch:
            return
        self.armed = False
        self._record()
        if self.cfg.kind == "nan_loss":
            module.loss_fault = lambda loss: loss * float("nan")
        elif self.cfg.kind == "exception":
            raise SimulatedDeviceError(f"simulated device error at step {step} (injected fault)")
        elif self.cfg.kind == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif self.cfg.kind == "hang":
            while True:  # no heartbeat from here on; the supervisor kills this process
                time.sleep(60)
        elif self.cfg.kind == "corrupt_checkpoint":
            corrupt_newest_checkpoint(self.checkpoints)
            raise SimulatedDeviceError(f"simulated device error after corrupting a checkpoint at step {step}")


def corrupt_newest_checkpoint(root: Path) -> Path:
    """Flip bytes in the middle of the newest complete checkpoint's model file."""
    path = Path(root) / step_dir_name(complete_steps(root)[-1]) / "model.pt"
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid : mid + 16] = bytes(b ^ 0xFF for b in data[mid : mid + 16])
    path.write_bytes(bytes(data))
    assert (path.parent / MARKER).is_file()
    return path
