"""Train one speculator with Lightning, resumable exactly, watched for loss spikes.

`fit` trains to the step budget starting from the run's newest complete checkpoint (a
fresh run saves the initial state as step 0). A watchdog trip rolls back inside this
process and goes on; any other error propagates, and the supervisor (supervisor.py),
which runs `fit` in a child process, decides whether to restart. Lightning stays a thin
adapter: it runs the steps; data order, checkpoints and resumption are ours
(sampler.py, checkpoint.py, progress.py).
"""

from __future__ import annotations

import datetime
import time
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy
from hydra.utils import instantiate
from omegaconf import OmegaConf

from speclab.speculator.base import Speculator
from speclab.speculator.target import FrozenTarget

from . import ranks
from .checkpoint import CheckpointConfig, CheckpointStore
from .faults import FaultConfig, FaultInjector, fired
from .features import FeatureDataset, collate
from .loggers import build_loggers
from .losses import objective
from .module import SpeculatorModule
from .precision import choose_precision
from .progress import LoopState, Progress
from .sampler import positioned_loader
from .stages import enter_stage, stage_ends, stage_of
from .supervisor import CHECKPOINTS, Heartbeat, SupervisorConfig
from .watchdog import WATCHDOG_FILE, Ledger, Watchdog, WatchdogConfig, WatchdogTripped


def fit(speculator: Speculator, target: FrozenTarget, dataset: FeatureDataset | list[FeatureDataset], cfg,
        run_dir: Path, seed: int, faults=None, config: dict | None = None, progress: bool = True) -> dict:
    """Returns the `train` block of result.json (the supervisor adds `restarts`). A list of
    data sets is trained in stages, one per `cfg.stages` entry (stages.py)."""
    run_dir, start = Path(run_dir), time.time()
    datasets = list(dataset) if isinstance(dataset, (list, tuple)) else [dataset]
    sizes = [len(d) for d in datasets]
    ends = stage_ends(cfg, sizes)
    ranks.join(target.device, SupervisorConfig(**_plain(cfg.supervisor)).collective_timeout_s)
    store = CheckpointStore(run_dir / CHECKPOINTS, CheckpointConfig.from_training(cfg))
    if ranks.is_writer():
        store.clean_partial()
    watchdog = Watchdog(WatchdogConfig(**_plain(cfg.watchdog)), run_dir / WATCHDOG_FILE)
    injector = FaultInjector(FaultConfig(**_plain(faults or {})), run_dir, store.root, cfg.accumulate_grad_batches)
    total = ends[-1]
    precision, precision_record = choose_precision(cfg.get("precision", "auto"), target.device)
    module = SpeculatorModule(speculator, target, objective(cfg.objective, cfg.fused_loss), instantiate(cfg.optimizer),
                              cfg.warmup_steps, total, online=cfg.features == "online", precision=precision)
    heartbeat = Heartbeat(run_dir) if ranks.is_writer() else _no_heartbeat
    while True:
        resume = load_latest(store)
        check_world_size(resume)
        # At a stage's last checkpoint the next stage starts: the same path whether the run
        # goes on in this process or resumes there after a crash.
        state = enter_stage(restore(resume, module, watchdog, sizes[0], run_dir), ends, sizes)
        watchdog.load_window(state.detector)  # the checkpoint's window; empty where a stage starts
        stage = stage_of(state)
        injector.begin_segment(state)
        loop = Progress(state, store, watchdog, cfg.checkpoint_every_n_steps, ends[stage], heartbeat, resume, config)
        try:
            if state.step < ends[stage]:
                trainer = build_trainer(cfg, ends[stage] - state.step, [injector, loop, watchdog], target, run_dir,
                                        config, progress)
                trainer.fit(module, positioned_loader(datasets[stage], cfg.batch_size, seed, state.position, collate,
                                                      ranks.rank(), ranks.world_size()))
            if stage == len(ends) - 1:
                break
        except WatchdogTripped as exc:
            roll_back(exc.trip, store, watchdog, loop.started_position)
    return {"steps": state.step, "tokens": state.tokens, "wall_s": time.time() - start,
            "final_loss": state.losses[-1] if state.losses else None, "loss_history": state.losses,
            "precision": precision, "precision_choice": precision_record, "world_size": ranks.world_size(),
            "rollbacks": len(watchdog.ledger.rollbacks), "rollback_log": watchdog.ledger.rollbacks,
            "lr_scale": watchdog.ledger.lr_scale, "faults": fired(run_dir),
            "stages": [{"end_step": end, "examples": n} for end, n in zip(ends, sizes)],
            "samples": {"consumed_min": int(state.consumed.min()), "consumed_max": int(state.consumed.max()),
                        "order_sha256": state.order_digest}}


def restore(resume: dict | None, module: SpeculatorModule, watchdog: Watchdog, num_samples: int,
            run_dir: Path) -> LoopState:
    """Model weights and loop state from a checkpoint (optimizer, scheduler, RNG: in Progress;
    the watchdog's window: from the state, once its stage is known)."""
    if resume is None:
        state = LoopState(num_samples)
    else:
        state = LoopState.from_state(resume["loop"])
        module.speculator.load_state_dict(resume["model"])
        if not (run_dir / WATCHDOG_FILE).is_file():  # the run-level ledger is newer when present
            watchdog.ledger = Ledger.from_json(resume["loop"]["ledger"])
    watchdog.step = state.step
    module.lr_scale = watchdog.ledger.lr_scale
    state.position.skips = watchdog.ledger.skips
    return state


def roll_back(trip, store: CheckpointStore, watchdog: Watchdog, trip_position: dict) -> None:
    """Back to the newest checkpoint before the spike's onset; its data window is skipped."""
    target = load_latest(store, before=trip.onset)
    if target is None:
        raise RuntimeError(f"watchdog tripped ({trip.reason}) but no complete checkpoint precedes step {trip.onset}")
    watchdog.roll_back(trip, target["step"], target["loop"]["position"], trip_position)  # may raise: budget
    if ranks.is_writer():
        store.drop_after(target["step"])


def load_latest(store: CheckpointStore, before: int | None = None) -> dict | None:
    """The newest checkpoint that verifies, rank 0 first: it alone quarantines a damaged one
    (two ranks renaming the same directory would race), and the others read after it, once
    what rank 0 wrote or removed (a rollback, a partial checkpoint) is final."""
    ranks.barrier()
    resume = store.load_latest(before) if ranks.is_writer() else None
    ranks.barrier()
    return resume if ranks.is_writer() else store.load_latest(before)


def check_world_size(resume: dict | None) -> None:
    """A checkpoint resumes on the world size it was trained with: its data position counts
    global batches of batch_size * world_size sequences, so another world size would train
    a different order than the run it continues."""
    saved = resume["loop"].get("world_size", 1) if resume is not None else ranks.world_size()
    if saved != ranks.world_size():
        raise ValueError(f"checkpoint step {resume['step']} was trained on {saved} process(es) and this run has "
                         f"{ranks.world_size()}: resume with training.devices={saved}, or train in a new run directory")


def _no_heartbeat(step: int, phase: str = "training") -> None:
    """Ranks other than 0 beat no heartbeat: the supervisor watches rank 0's."""


def build_trainer(cfg, steps: int, callbacks: list, target: FrozenTarget, run_dir: Path, config, progress: bool) -> L.Trainer:
    # The budget is in steps (max_epochs=-1): tqdm's bar shows "Epoch N" without a total,
    # where Lightning's rich bar would print "Epoch N/-2".
    callbacks = [*callbacks, TQDMProgressBar()] if progress and ranks.is_writer() else callbacks
    return L.Trainer(
        max_steps=steps, max_epochs=-1, accelerator="cuda" if target.device.type == "cuda" else "cpu",
        devices=cfg.get("devices", 1), strategy=strategy(cfg, target.device),
        use_distributed_sampler=False,  # each rank's share of a global batch comes from our sampler
        logger=build_loggers(run_dir, config), callbacks=callbacks, enable_checkpointing=False,
        accumulate_grad_batches=cfg.accumulate_grad_batches, gradient_clip_val=cfg.grad_clip,
        log_every_n_steps=cfg.log_every_n_steps, enable_progress_bar=progress and ranks.is_writer(),
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )


def strategy(cfg, device):
    """Lightning's strategy: `ddp` or `fsdp` over the group the supervisor started
    (ranks.py), with the collective timeout that turns a hung peer into a retryable failure;
    else as configured."""
    name = cfg.get("strategy", "auto")
    if name not in ranks.PARALLEL:
        return name
    # LightningEnvironment: the ranks' places come from the supervisor (ranks.py), also inside a
    # SLURM job, whose environment would otherwise give every rank the job's one task id.
    common = dict(process_group_backend="nccl" if device.type == "cuda" else "gloo", cluster_environment=LightningEnvironment(),
                  timeout=datetime.timedelta(seconds=SupervisorConfig(**_plain(cfg.supervisor)).collective_timeout_s))
    if name == "fsdp":
        if device.type != "cuda":  # torch's FSDP shards on accelerators only; Lightning refuses it on CPU too
            raise ValueError("training.strategy=fsdp needs CUDA devices (target.device=cuda); on CPU processes "
                             "train data-parallel with training.strategy=ddp")
        # Checkpoints hold the full (gathered) weights and optimizer state, as one process's do:
        # a run resumes from them, and the parent scores the final weights, with no sharding.
        return FSDPStrategy(state_dict_type="full", **common)
    # Unused parameters: a family may leave a head without a gradient on a step (a draft
    # vocabulary row never hit); DDP would otherwise wait for it forever.
    return DDPStrategy(find_unused_parameters=True, **common)


def _plain(node) -> dict:
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else dict(node)
