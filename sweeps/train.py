"""`speclab train [OVERRIDES]`: one experiment, or a Hydra multirun with -m."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from .experiment import run_experiment

log = logging.getLogger(__name__)


@hydra.main(config_path="pkg://speclab.configs", config_name="config", version_base=None)
def main(cfg: DictConfig) -> float | None:
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    try:
        result = run_experiment(cfg, run_dir)
    except Exception as exc:
        log.exception("run %s failed", run_dir)
        if hydra_cfg.mode == RunMode.MULTIRUN:
            return None  # the failure is in its result.json; the rest of the sweep goes on
        print(f"speclab train: run failed: {exc}".splitlines()[0], file=sys.stderr)
        sys.exit(1)
    a, t = result["acceptance"], result["throughput"]
    print(f"{run_dir}: {result['speculator']['family']} acceptance length {a['mean_acceptance_length']:.2f}, "
          f"{t['spec_tok_s']:.1f} tok/s vs {t['baseline_tok_s']:.1f} plain, speedup {t['speedup']:.2f}x")
    return t["speedup"]  # the objective a sweeper (e.g. Optuna) maximises


if __name__ == "__main__":
    main()
