"""The Lightning loggers of one training run: always a CSV log in the run directory."""

from __future__ import annotations

from pathlib import Path

from lightning.pytorch.loggers import CSVLogger, Logger


def build_loggers(run_dir: Path, cfg=None) -> list[Logger]:
    """CSV metrics in run_dir/logs/metrics.csv; `cfg` (the run's config) may add more."""
    return [CSVLogger(run_dir, name="logs", version="")]
