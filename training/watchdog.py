"""The loss-spike watchdog: trip on a non-finite loss or a sustained spike, then roll back.

Rules (`SpikeDetector`, pure, tested on synthetic series):
- a non-finite loss or gradient norm trips at once (onset = that step);
- a step is *spiky* when its loss exceeds mean + sigma * std of the trailing window of
  non-spiky losses, or ratio * their mean, once the window holds `min_window` losses;
  before that, from `ratio_after` losses on (the first steps), when it exceeds ratio * their
  median. `patience` consecutive spiky steps trip (onset = the first of them).
  Spiky losses never enter the window while their streak lasts, so a spike cannot raise
  the bar it is measured against; a streak that ends short of `patience` was noise, and
  its losses then join the window (left out, they would bias a noisy window low). The
  median is what lets a rule arm that early: one odd loss among the first few cannot
  move it, where it would drag a mean of three. (With no early rule, a spike that began
  before `min_window` filled the window and hid itself.)

A trip rolls the run back to the newest complete checkpoint from before the onset,
skips the data consumed between that checkpoint and the trip, and, on a second trip
whose onset falls inside the window of the previous one, also scales the LR by
`lr_backoff`. `max_rollbacks` bounds the rollbacks of a run: one more trip fails the run
with a clear reason (`RollbackBudgetExhausted`), never a loop.

The ledger (trips, skipped windows, LR scale) outlives rollbacks and restarts: it is
kept in the run's `watchdog.json`, written before a rollback acts, and a copy goes into
each checkpoint. The detector's window is part of the checkpoint's loop state, so a
resumed run judges the next step exactly as the uninterrupted run would have. A training
stage starts an empty window (stages.py: its state carries none, `load_window`): its
data's losses are judged against their own.

Under DDP the loss the detector sees is the mean over ranks and the trip flag is
all-reduced (any rank trips -> all trip), so every rank rolls back together.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.strategies import FSDPStrategy

from . import ranks
from .checkpoint import write_json_atomic

WATCHDOG_FILE = "watchdog.json"  # the run's ledger, beside result.json


@dataclass
class WatchdogConfig:
    """Spike rule thresholds and the rollback budget (training config block `watchdog`)."""

    mode: Literal["rollback", "off"] = "rollback"
    """rollback: trips roll the run back | off: never trips (non-finite losses train on)."""
    window: int = 50
    """Trailing non-spiky losses the mean and std are taken over."""
    min_window: int = 10
    """Losses needed in the window before the sigma rule is armed (non-finite trips always)."""
    ratio_after: int = 3
    """Losses needed in the window before the ratio rule (ratio * median) is armed."""
    sigma: float = 6.0
    """A loss above mean + sigma * std of the window is spiky."""
    ratio: float = 2.0
    """A loss above ratio * mean of the window is spiky."""
    patience: int = 3
    """Consecutive spiky steps that trip."""
    max_rollbacks: int = 3
    """Rollbacks allowed per run; the next trip fails the run."""
    lr_backoff: float = 0.5
    """LR multiplier applied on a second trip inside the previous trip's window."""


@dataclass
class Trip:
    step: int  # the step at which the watchdog tripped
    onset: int  # the first bad step: the rollback target is a checkpoint from before it
    reason: str


class WatchdogTripped(Exception):
    """Raised from the callback to end the Lightning fit; the loop in train.py rolls back."""

    def __init__(self, trip: Trip):
        super().__init__(f"watchdog tripped at step {trip.step}: {trip.reason}")
        self.trip = trip


class RollbackBudgetExhausted(RuntimeError):
    """More trips than `max_rollbacks`: the run fails (fatal, the supervisor does not retry)."""


class SpikeDetector:
    def __init__(self, cfg: WatchdogConfig):
        self.cfg = cfg
        self.window: deque[float] = deque(maxlen=cfg.window)
        self.streak_onset: int | None = None
        self.streak = 0
        self.pending: list[float] = []  # the current streak's losses, kept out of the window while it lasts

    def update(self, step: int, loss: float, grad_norm: float | None = None) -> Trip | None:
        if not math.isfinite(loss) or (grad_norm is not None and not math.isfinite(grad_norm)):
            what = "loss" if not math.isfinite(loss) else "gradient norm"
            return Trip(step, step, f"non-finite {what} at step {step}")
        bar, why = self._bar()
        if bar is not None and loss > bar:
            self.streak += 1
            self.streak_onset = step if self.streak == 1 else self.streak_onset
            self.pending.append(loss)
            if self.streak >= self.cfg.patience:
                return Trip(step, self.streak_onset, f"loss spike: {self.streak} steps above {bar:.4g} "
                            f"({why}) since step {self.streak_onset}")
            return None
        if self.streak < self.cfg.patience:  # a blip shorter than patience: noise after all
            self.window.extend(self.pending)
        self.streak, self.streak_onset, self.pending = 0, None, []
        self.window.append(loss)
        return None

    def _bar(self) -> tuple[float | None, str]:
        """The bar a loss must exceed to be spiky, and how it was set (None: not armed yet)."""
        n = len(self.window)
        if n < min(self.cfg.ratio_after, self.cfg.min_window):
            return None, "unarmed"
        if n < self.cfg.min_window:  # the first steps: too few losses for a std, a median resists one odd one
            median = statistics.median(self.window)
            return self.cfg.ratio * median, f"{self.cfg.ratio:g} x median {median:.4g} of the first {n} losses"
        mean = sum(self.window) / n
        std = math.sqrt(sum((x - mean) ** 2 for x in self.window) / n)
        return min(mean + self.cfg.sigma * std, self.cfg.ratio * mean), f"window mean {mean:.4g}, std {std:.3g}"

    def state_dict(self) -> dict:
        return {"window": list(self.window), "streak": self.streak, "streak_onset": self.streak_onset,
                "pending": list(self.pending)}

    def load_state_dict(self, state: dict) -> None:
        self.window = deque(state["window"], maxlen=self.cfg.window)
        self.streak, self.streak_onset = state["streak"], state["streak_onset"]
        self.pending = list(state.get("pending", []))  # absent from checkpoints of older runs


@dataclass
class Ledger:
    """What the watchdog did to a run; survives rollbacks and restarts."""

    rollbacks: list[dict] = field(default_factory=list)
    """One record per rollback: step, onset, target, reason, skipped window, lr_scale, time."""
    lr_scale: float = 1.0

    @property
    def skips(self) -> list[tuple[int, int, int]]:
        return [tuple(w) for r in self.rollbacks for w in r["skip"]]

    def to_json(self) -> dict:
        return {"rollbacks": self.rollbacks, "lr_scale": self.lr_scale}

    @classmethod
    def from_json(cls, data: dict) -> "Ledger":
        return cls(list(data["rollbacks"]), data["lr_scale"])


class Watchdog(Callback):
    """Feeds each optimiser step's loss and gradient norm to the detector; raises on a trip."""

    def __init__(self, cfg: WatchdogConfig, ledger_path: Path):
        self.cfg, self.ledger_path = cfg, Path(ledger_path)
        self.ledger = load_ledger(self.ledger_path)
        self.detector = SpikeDetector(cfg)
        self._grad_norm: float | None = None
        self.step = 0  # the last completed optimiser step of the run (set by the loop on resume)

    def load_window(self, window: dict | None) -> None:
        """Judge the next step against `window`: a checkpoint's, or an empty one (None: a run's
        first step or a training stage's, whose new data is judged against its own losses)."""
        self.detector = SpikeDetector(self.cfg)
        if window is not None:
            self.detector.load_state_dict(window)

    def on_before_optimizer_step(self, trainer, module, optimizer):
        grads = [p.grad for p in module.parameters() if p.grad is not None and p.grad.numel()]
        squares = torch.stack([torch.linalg.vector_norm(g.float()) ** 2 for g in grads]).sum() if grads else torch.zeros(())
        if isinstance(trainer.strategy, FSDPStrategy):  # each rank holds a shard of the gradients
            squares = ranks.all_sum(squares)
        norm = float(squares.sqrt())
        self._grad_norm = norm
        if not math.isfinite(norm):  # before the step is taken: the weights stay clean
            self._check(trainer, Trip(self.step + 1, self.step + 1, f"non-finite gradient norm at step {self.step + 1}"))

    def observe(self, trainer, step: int, loss: float) -> None:
        """Called by the loop after each optimiser step, before the step's checkpoint."""
        self.step = step
        last = self.ledger.rollbacks[-1] if self.ledger.rollbacks else None
        if last is not None and "resume_s" not in last:  # the first step after a rollback
            last["resume_s"] = time.time() - last["time"]
            self.save_ledger()
        loss = float(trainer.strategy.reduce(torch.tensor(loss), reduce_op="mean"))
        self._check(trainer, self.detector.update(step, loss, self._grad_norm))

    def _check(self, trainer, trip: Trip | None) -> None:
        if self.cfg.mode == "off":
            return
        if trainer.strategy.reduce_boolean_decision(trip is not None, all=False):
            raise WatchdogTripped(trip or Trip(-1, -1, "another rank tripped"))

    def roll_back(self, trip: Trip, target_step: int, target_position: dict, trip_position: dict) -> dict:
        """Record the rollback in the ledger: the skipped window and, on a repeat, the LR backoff."""
        if len(self.ledger.rollbacks) >= self.cfg.max_rollbacks:
            raise RollbackBudgetExhausted(f"watchdog rollback budget exhausted ({self.cfg.max_rollbacks} "
                                          f"rollbacks used); last trip: {trip.reason}")
        previous = self.ledger.rollbacks[-1] if self.ledger.rollbacks else None
        if previous is not None and previous["target"] <= trip.onset <= previous["step"]:
            self.ledger.lr_scale *= self.cfg.lr_backoff
        record = {"step": trip.step, "onset": trip.onset, "target": target_step, "reason": trip.reason,
                  "skip": _window(target_position, trip_position), "lr_scale": self.ledger.lr_scale,
                  "time": time.time()}
        self.ledger.rollbacks.append(record)
        self.save_ledger()  # before the rollback acts, so that a crash cannot lose it
        return record

    def save_ledger(self) -> None:
        if ranks.is_writer():  # every rank holds the same ledger; rank 0 keeps the run's file
            write_json_atomic(self.ledger_path, self.ledger.to_json())


def _window(start: dict, end: dict) -> list[tuple[int, int, int]]:
    """The data positions consumed from `start` to `end`, as (epoch, lo, hi) ranges."""
    if end["epoch"] == start["epoch"]:
        return [(start["epoch"], start["cursor"], end["cursor"])] if end["cursor"] > start["cursor"] else []
    whole = [(e, 0, 1 << 62) for e in range(start["epoch"] + 1, end["epoch"])]
    return [(start["epoch"], start["cursor"], 1 << 62), *whole, (end["epoch"], 0, end["cursor"])]


def load_ledger(path: Path) -> Ledger:
    return Ledger.from_json(json.loads(path.read_text())) if path.is_file() else Ledger()
