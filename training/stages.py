"""Training in stages: one run, one config, the data switched at a step boundary.

IBM's speculator recipe (fms-fsdp) trains in two stages: first on a teacher-forced corpus
(the target's own distributions over raw text, cheap: no generation), then on responses the
target generated itself (the distribution speculative decoding meets). Here a stage is a
data config (the run's `data` with the stage's keys changed) and a step budget:

    training.stages: [{data: {source: code_corpus}, epochs: 1}, {epochs: 3}]

The optimiser, the LR schedule (one warm-up, one cosine over every stage), the watchdog and
the checkpoints run on across a boundary; step numbers are the run's. The watchdog's spike
window alone starts afresh in each stage: a new data set's losses have a level of their own
(`mlp` ends 1M tokens of Python source near 1.5 and starts the target's answers near 3), and
judged against the last stage's window that level reads as a spike, trips, and rolls back
into the boundary until the rollback budget fails the run. A stage's data
position counts its epochs from `STAGE_EPOCHS * stage`, so a checkpoint's position says
which stage it is in, and the watchdog's skipped windows (recorded by epoch) never reach
into another stage's data.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .progress import LoopState
from .sampler import DataPosition

STAGE_EPOCHS = 10_000  # epochs numbered per stage: stage k's first epoch is k * STAGE_EPOCHS


@dataclass
class StageConfig:
    data: dict = field(default_factory=dict)
    """Keys of the run's `data` config this stage changes ({}: the run's data as it is)."""
    epochs: int | None = None
    """Passes over this stage's data (None: training.epochs)."""
    max_steps: int | None = None
    """This stage's step budget (None: training.max_steps; -1: its epochs decide)."""


def stage_configs(training_cfg) -> list[StageConfig]:
    """The run's stages; no `training.stages` (or an empty list) is one stage on the run's data."""
    stages = training_cfg.get("stages") or [{}]
    known = set(StageConfig.__dataclass_fields__)
    for i, s in enumerate(stages):
        if set(s) - known:
            raise ValueError(f"training.stages[{i}]: unknown keys {sorted(set(s) - known)}; a stage has {sorted(known)}")
    return [StageConfig(**dict(s)) for s in stages]


def stage_data(data_cfg: dict, stage: StageConfig) -> dict:
    unknown = set(stage.data) - set(data_cfg)
    if unknown:
        raise ValueError(f"training.stages: data keys {sorted(unknown)} are not keys of the data config")
    return {**data_cfg, **dict(stage.data)}


def stage_steps(training_cfg, stage: StageConfig, num_samples: int) -> int:
    """A stage's optimiser steps: its max_steps, else epochs of ceil(batches / accumulation)."""
    max_steps = training_cfg.max_steps if stage.max_steps is None else stage.max_steps
    if max_steps > 0:
        return max_steps
    epochs = training_cfg.epochs if stage.epochs is None else stage.epochs
    batches = -(-num_samples // training_cfg.batch_size)
    return epochs * -(-batches // training_cfg.accumulate_grad_batches)


def stage_ends(training_cfg, sizes: list[int]) -> list[int]:
    """The run's step at which each stage ends (cumulative)."""
    stages = stage_configs(training_cfg)
    if len(stages) != len(sizes):
        raise ValueError(f"{len(stages)} training stages but {len(sizes)} data sets")
    ends, step = [], 0
    for stage, n in zip(stages, sizes):
        step += stage_steps(training_cfg, stage, n)
        ends.append(step)
    return ends


def stage_of(state: LoopState) -> int:
    return state.position.epoch // STAGE_EPOCHS


def enter_stage(state: LoopState, ends: list[int], sizes: list[int]) -> LoopState:
    """At a stage's last step, the next stage's first data position (same step, tokens and
    losses; an empty watchdog window, see the module's docstring); inside a stage, `state` itself."""
    k = stage_of(state)
    if k + 1 >= len(ends) or state.step < ends[k]:
        return state
    position = DataPosition(epoch=(k + 1) * STAGE_EPOCHS, skips=state.position.skips)
    return LoopState(sizes[k + 1], step=state.step, position=position, tokens=state.tokens,
                     losses=list(state.losses), detector=None)
