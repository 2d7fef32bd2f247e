"""The run's loop state and the callback that keeps it: steps, data position, checkpoints.

`LoopState` is what a run has done so far, as the uninterrupted run would have it after
`step` optimiser steps: the data position, tokens, the per-step losses, how often each
sample was consumed (`consumed`, [N]) and an order-sensitive digest of the samples in
the order trained (so two runs' data orders can be compared without storing it). It is
part of every checkpoint, so a resumed run's history continues the one it resumed.

`Progress` (a Lightning callback) restores a checkpoint's optimizer, scheduler and RNG
states once Lightning has built the optimizer, records every micro-batch, and after
each optimiser step beats the heartbeat, asks the watchdog, and saves a checkpoint on
the cadence. Lightning's own checkpointing is not used: it cannot resume mid-epoch at
an exact data position.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field

import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.strategies import FSDPStrategy

from . import ranks
from .checkpoint import CheckpointStore
from .sampler import DataPosition
from .watchdog import Watchdog


@dataclass
class LoopState:
    num_samples: int
    step: int = 0
    position: DataPosition = field(default_factory=DataPosition)
    tokens: int = 0
    losses: list[float] = field(default_factory=list)
    """Per optimiser step: the mean of its micro-batches' losses."""
    consumed: torch.Tensor | None = None  # [N] int32: times each sample was trained on
    order_digest: str = hashlib.sha256(b"").hexdigest()
    detector: dict | None = None  # the watchdog's window

    def __post_init__(self):
        if self.consumed is None:
            self.consumed = torch.zeros(self.num_samples, dtype=torch.int32)

    def state_dict(self) -> dict:
        return {"num_samples": self.num_samples, "step": self.step, "position": self.position.state_dict(),
                "tokens": self.tokens, "losses": list(self.losses), "consumed": self.consumed.clone(),
                "order_digest": self.order_digest, "detector": self.detector}

    @classmethod
    def from_state(cls, s: dict) -> "LoopState":
        return cls(s["num_samples"], s["step"], DataPosition.from_state(s["position"]), s["tokens"], list(s["losses"]),
                   s["consumed"].clone(), s["order_digest"], s["detector"])


def rng_state() -> dict:
    keys, pos, has_gauss, gauss = np.random.get_state()[1:]
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    return {"python": random.getstate(), "numpy": {"keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
            "has_gauss": int(has_gauss), "gauss": float(gauss)}, "torch": torch.get_rng_state(), "cuda": cuda}


def set_rng_state(state: dict) -> None:
    random.setstate((state["python"][0], tuple(state["python"][1]), state["python"][2]))
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def load_optimizer(trainer, opt, state: dict) -> None:
    """A checkpoint's optimizer state (one process's layout, keyed by parameter index) into
    `opt`; under FSDP each rank keeps its shard of it."""
    if not isinstance(trainer.strategy, FSDPStrategy):
        opt.load_state_dict(state)
        return
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import FullStateDictConfig, FullOptimStateDictConfig, OptimStateKeyType, StateDictType

    model = trainer.strategy.model
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, FullStateDictConfig(rank0_only=False),
                              FullOptimStateDictConfig(rank0_only=False)):
        named = FSDP.rekey_optim_state_dict(state, OptimStateKeyType.PARAM_NAME, model)
        opt.load_state_dict(FSDP.optim_state_dict_to_load(model, opt, named))


class Progress(Callback):
    def __init__(self, state: LoopState, store: CheckpointStore, watchdog: Watchdog, every_n_steps: int,
                 total_steps: int, beat, resume: dict | None, config: dict | None):
        self.state, self.store, self.watchdog = state, store, watchdog
        self.every_n_steps, self.total_steps, self.beat = every_n_steps, total_steps, beat
        self.resume, self.config = resume, config
        self._micro: list[float] = []
        self._seen_global_step = 0
        self.started_position = state.position.state_dict()  # after the newest batch begun (a trip's window end)

    def on_train_start(self, trainer, module):
        opt, sched = trainer.optimizers[0], trainer.lr_scheduler_configs[0].scheduler
        if self.resume is None:
            self.save(trainer, module)  # step 0: the initial state, the oldest rollback target
        else:
            load_optimizer(trainer, opt, self.resume["optimizer"])
            sched.load_state_dict(self.resume["scheduler"])
            set_rng_state(self.resume["rng"])
        # The LR of the next step as the schedule gives it: equal to the saved one unless
        # the watchdog has since scaled the LR down.
        for group, base, fn in zip(opt.param_groups, sched.base_lrs, sched.lr_lambdas):
            group["lr"] = base * fn(sched.last_epoch)
        self._seen_global_step = trainer.global_step
        # Lightning counts this fit's steps from 0; its loggers then write the run's step.
        trainer.fit_loop.epoch_loop._batches_that_stepped = self.state.step
        self.beat(self.state.step)

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        epoch, cursor = batch["position"]
        self.started_position = {"epoch": epoch, "cursor": cursor}

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        s = self.state
        self._micro.append(float(module.last_loss))  # every rank's tokens (module.py)
        s.tokens += int(ranks.all_sum(batch["loss_mask"].sum()))
        ids = ranks.gather_ids(batch["sample_ids"].cpu())  # Lightning moved the batch to the device
        s.consumed[ids] += 1
        s.order_digest = hashlib.sha256(s.order_digest.encode() + ids.numpy().astype(np.int64).tobytes()).hexdigest()
        s.position.epoch, s.position.cursor = batch["position"]
        if trainer.global_step == self._seen_global_step:
            return  # inside gradient accumulation: no optimiser step yet
        self._seen_global_step = trainer.global_step
        s.step += 1
        s.losses.append(sum(self._micro) / len(self._micro))
        self._micro = []
        self.beat(s.step)
        self.watchdog.observe(trainer, s.step, s.losses[-1])  # may raise WatchdogTripped
        if s.step % self.every_n_steps == 0 or s.step == self.total_steps:
            self.save(trainer, module)

    def save(self, trainer, module) -> None:
        """Rank 0 writes (every rank holds the same weights and optimizer state); the others
        wait until the checkpoint is complete, so none can read a step that is not there."""
        self.state.detector = self.watchdog.detector.state_dict()
        # Every rank takes part: under FSDP gathering the full weights and optimizer state
        # are collectives (rank 0 receives them); elsewhere these are the module's own.
        model = {k.removeprefix("speculator."): v for k, v in trainer.strategy.lightning_module_state_dict().items()}
        optimizer = trainer.strategy.optimizer_state(trainer.optimizers[0])
        if ranks.is_writer():
            states = {"model": model, "optimizer": optimizer,
                      "scheduler": trainer.lr_scheduler_configs[0].scheduler.state_dict(),
                      "loop": {**self.state.state_dict(), "ledger": self.watchdog.ledger.to_json(),
                               "world_size": ranks.world_size()}, "rng": rng_state()}
            self.store.save(self.state.step, states, self.config)
        ranks.barrier()
