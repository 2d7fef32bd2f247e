"""Every sweep's leaderboard carries the training-free baselines (docs/guide.md).

A Hydra callback (configs/sweep/common/base.yaml installs it in every predefined sweep):
when a multirun starts, before its first job, it scores each family of BASELINES with the
sweep's own settings (same target, data and eval prompts; the speculator group swapped),
in the sweep's process, into `<sweep dir>/baseline-<family>/`. Nothing is trained, so each
costs one scoring pass. A baseline already completed in this sweep's directory with the
same resolved config is not run again (resume, as for the sweep's jobs); one that fails is
recorded failed in its result.json and the sweep goes on. A sweep relaunched in the same
directory with other settings (another data budget, say) scores its baselines again, into
`baseline-<family>-<config hash prefix>/`: the earlier completed ones are kept, never overwritten.

The same resolved config as a sweep job's `speculator=<family>` (the arch sweep has one):
that job then finds this run completed and is skipped.
"""

from __future__ import annotations

import logging
from importlib import resources
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from speclab.configs.schemas import family_config
from speclab.speculator.families import speculator_class

from .resume import check_run_dir_free, config_hash, find_completed
from .table import BASELINE_FAMILIES as BASELINES

log = logging.getLogger(__name__)
RUN_PREFIX = "baseline-"


def baseline_config(sweep_config: DictConfig, family: str) -> DictConfig:
    """The sweep's config without Hydra's node, its speculator replaced by the family's config file."""
    plain = OmegaConf.to_container(sweep_config, resolve=False)
    plain.pop("hydra", None)
    path = resources.files("speclab.configs") / "speculator" / f"{family}.yaml"
    overrides = OmegaConf.to_container(OmegaConf.create(path.read_text()))
    assert overrides.pop("defaults") == [{"/schema/speculator@_here_": family}, "_self_"], path  # the schema alone
    plain["speculator"] = family_config(speculator_class(family).Config, family, overrides)
    cfg = OmegaConf.create(plain)
    cfg.run_name = f"{RUN_PREFIX}{family}"
    return cfg


def score_baselines(sweep_config: DictConfig, sweep_dir: Path) -> list[Path]:
    """Run (or find done) every baseline of BASELINES in sweep_dir; their run directories."""
    from .experiment import run_experiment  # torch and transformers: only when a sweep starts

    done = []
    for family in BASELINES:
        cfg = baseline_config(sweep_config, family)
        wanted = config_hash(OmegaConf.to_container(cfg, resolve=True))
        run_dir = find_completed(sweep_dir, wanted)
        if run_dir is None:
            run_dir = baseline_dir(sweep_dir, family, wanted)
            run_dir.mkdir(parents=True, exist_ok=True)
            try:
                run_experiment(cfg, run_dir)
            except Exception:  # noqa: BLE001 - recorded in its result.json; the sweep's own runs matter more
                log.exception("baseline %s failed", family)
        done.append(run_dir)
    return done


def baseline_dir(sweep_dir: Path, family: str, wanted_hash: str) -> Path:
    """Where a baseline of this config hash runs: `baseline-<family>`, unless that holds a
    completed run of another config, then `baseline-<family>-<hash prefix>`."""
    plain = sweep_dir / f"{RUN_PREFIX}{family}"
    try:
        check_run_dir_free(plain, wanted_hash)
    except FileExistsError:
        return sweep_dir / f"{RUN_PREFIX}{family}-{wanted_hash[:8]}"
    return plain


class ScoreBaselines(Callback):
    """Hydra callback: `score_baselines` when a multirun starts."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(OmegaConf.select(config, "hydra.sweep.dir", throw_on_resolution_failure=True))
        score_baselines(config, sweep_dir)
