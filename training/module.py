"""The thin Lightning adapter: `training_step` calls the speculator's own loss."""

from __future__ import annotations

import math
from typing import Callable

import lightning as L
import torch
import torch.nn.functional as F

from speclab.speculator.base import Objective, Speculator
from speclab.speculator.target import FrozenTarget

from . import ranks
from .features import to_features


class SpeculatorModule(L.LightningModule):
    def __init__(self, speculator: Speculator, target: FrozenTarget, objective: Objective,
                 optimizer: Callable, warmup_steps: int, total_steps: int, online: bool, precision: str = "fp32"):
        super().__init__()
        self.speculator = speculator
        # The target is frozen and not ours to checkpoint: keep it out of the module tree.
        self._target = [target]
        self.online = online
        # bf16: the speculator's forward under autocast (its backward follows the forward's
        # dtypes); weights, gradients and AdamW stay fp32. Our autocast, not Lightning's
        # bf16-mixed plugin, which refuses gradient clipping beside a fused optimizer.
        self.precision = precision
        self.objective = objective
        self.make_optimizer = optimizer
        self.warmup_steps, self.total_steps = warmup_steps, total_steps
        self._head_rows = None  # (columns, the LM head's rows there), reused across steps
        self.lr_scale = 1.0  # the watchdog's LR backoff after repeated spikes (1.0: none)
        self.loss_fault = None  # an injected fault's loss transform (faults.py), else None
        self.last_loss: torch.Tensor | None = None  # the micro-batch's loss, for the run's loop

    def target_logits(self, hidden: torch.Tensor, columns: torch.Tensor | None) -> torch.Tensor:
        """[N, H] -> the target's logits [N, V], or only at `columns` [N, len(columns)].

        On the CPU in fp32 whatever the target's dtype: torch's bf16 matmul on a CPU without
        bf16 instructions ran 10.7x slower than fp32 (2000 x 576 by 8192 x 576 on an AVX2
        Zen 2: 1,812 against 169 ms), which made this product 43% of a training step's
        forward. fp32 over the bf16 weights is also what the lean runtime computes (the
        weights widen exactly), so the logits trained towards are the decoder's own."""
        if self._head_rows is None or self._head_rows[0] is not columns:
            head = self._target[0].lm_head_weight  # [V, H]
            if columns is not None:
                head = head[columns.to(head.device)]
            self._head_rows = (columns, head.float() if head.device.type == "cpu" else head)
        head = self._head_rows[1]
        with torch.autocast(hidden.device.type, enabled=False):  # the teacher in fp32 under bf16 training too
            return F.linear(hidden.to(head.dtype), head).float()

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        feats = to_features(batch, self._target[0] if self.online else None, self.speculator.target_layer_ids)
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.precision == "bf16"):
            loss, metrics = self.speculator.loss(feats, self.objective, self.target_logits)
        loss = loss.float()
        if self.loss_fault is not None:
            loss = self.loss_fault(loss)
        loss, self.last_loss = self._global(loss, feats.loss_mask.sum().float())
        self.log("train/loss", self.last_loss, prog_bar=True)
        self.log_dict({f"train/{k}": v for k, v in metrics.items()})
        self.log("train/tokens", float(feats.loss_mask.sum()), reduce_fx="sum")
        return loss

    @staticmethod
    def _global(loss: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the loss to differentiate, the micro-batch's loss over every rank).

        A rank's loss is a mean over its own tokens, and DDP averages the ranks' gradients.
        Weighting rank r's loss by world * tokens_r / tokens_all makes that average the
        gradient of the token mean over the whole global batch, which is what one process
        with the whole batch differentiates (exactly for a loss that is one token mean;
        families that average per-position means match to the spread of those counts)."""
        if not ranks.active():
            return loss, loss.detach()
        total = ranks.all_sum(tokens)
        return loss * (tokens * ranks.world_size() / total), ranks.all_sum(loss.detach() * tokens) / total

    def configure_optimizers(self):
        opt = self.make_optimizer(self.speculator.parameters())
        sched = torch.optim.lr_scheduler.LambdaLR(opt, self._lr_factor)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def _lr_factor(self, step: int) -> float:
        """Linear warm-up, then cosine decay to 10% of the peak by the last step (times `lr_scale`)."""
        if step < self.warmup_steps:
            return self.lr_scale * (step + 1) / self.warmup_steps
        progress = min(1.0, (step - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps))
        return self.lr_scale * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
