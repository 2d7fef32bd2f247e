"""Train one speculator with Lightning on cached (or online) target features."""

from __future__ import annotations

import time
from pathlib import Path

import lightning as L
import torch
from hydra.utils import instantiate
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from speclab.speculator.base import Speculator
from speclab.speculator.target import FrozenTarget

from .features import FeatureDataset, collate
from .loggers import build_loggers
from .losses import objective
from .module import SpeculatorModule


class LossHistory(Callback):
    """Keeps the per-step loss and the number of loss tokens seen."""

    def __init__(self):
        self.losses: list[float] = []
        self.tokens = 0

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.losses.append(float(outputs["loss"]))
        self.tokens += int(batch["loss_mask"].sum())


def fit(speculator: Speculator, target: FrozenTarget, dataset: FeatureDataset, cfg, run_dir: Path,
        seed: int, progress: bool = True) -> dict:
    """Returns the `train` block of result.json."""
    generator = torch.Generator().manual_seed(seed)
    loader = torch.utils.data.DataLoader(dataset, batch_size=cfg.batch_size, shuffle=True,
                                         generator=generator, collate_fn=collate)
    total = cfg.max_steps if cfg.max_steps > 0 else cfg.epochs * len(loader)
    module = SpeculatorModule(speculator, target, objective(cfg.objective), instantiate(cfg.optimizer),
                              cfg.warmup_steps, total, online=cfg.features == "online")
    history = LossHistory()
    trainer = L.Trainer(
        max_steps=total, max_epochs=cfg.epochs if cfg.max_steps <= 0 else -1,
        accelerator="cuda" if target.device.type == "cuda" else "cpu", devices=1,
        logger=build_loggers(run_dir),
        callbacks=[history, ModelCheckpoint(dirpath=run_dir / "checkpoints", every_n_train_steps=cfg.checkpoint_every_n_steps,
                                            save_last=True, save_top_k=-1)],
        gradient_clip_val=cfg.grad_clip, log_every_n_steps=cfg.log_every_n_steps,
        enable_progress_bar=progress, enable_model_summary=False, num_sanity_val_steps=0,
    )
    start = time.time()
    trainer.fit(module, loader)
    return {"steps": trainer.global_step, "tokens": history.tokens, "wall_s": time.time() - start,
            "final_loss": history.losses[-1] if history.losses else None,
            "loss_history": history.losses, "restarts": 0, "rollbacks": 0}
