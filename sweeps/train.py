"""`speclab train [OVERRIDES]`: one experiment, or a Hydra multirun with -m.

With `resume=skip_completed` (every predefined sweep sets it) a job whose resolved config
matches a completed run under runs_dir returns that run's measured speedup without
running again (sweeps/resume.py).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from .index import metric_value, row_of
from .resume import check_run_dir_free, config_hash, digest, find_completed
from .results import read_result, write_json_atomic

log = logging.getLogger(__name__)
RESUMED_FILE = "resumed.json"  # left in a skipped job's directory: which run already did its work

# Used by the sweep configs' run-directory names; registered at import, before Hydra composes.
OmegaConf.register_new_resolver("speclab_digest", digest, replace=True)


def _register_halving_sweeper() -> None:
    """Hydra finds plugins by scanning the hydra_plugins folders on disk, which misses an
    editable install's import hook: register speclab's sweeper explicitly."""
    from hydra.core.plugins import Plugins
    from hydra_plugins.speclab_halving_sweeper.halving_sweeper import SuccessiveHalvingSweeper

    Plugins.instance().register(SuccessiveHalvingSweeper)


_register_halving_sweeper()


@hydra.main(config_path="pkg://speclab.configs", config_name="config", version_base=None)
def main(cfg: DictConfig) -> float | None:
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    if cfg.resume == "skip_completed":
        wanted = config_hash(OmegaConf.to_container(cfg, resolve=True))
        done = find_completed(cfg.runs_dir, wanted)
        if done is not None:
            return skipped(run_dir, done)
        check_run_dir_free(run_dir, wanted)
    from .experiment import run_experiment  # torch, transformers, lightning: not needed to skip

    try:
        result = run_experiment(cfg, run_dir)
    except Exception as exc:
        log.exception("run %s failed", run_dir)
        if multirun:
            return None  # the failure is in its result.json; the rest of the sweep goes on
        print(f"speclab train: run failed: {exc}".splitlines()[0], file=sys.stderr)
        sys.exit(1)
    a, t = result["acceptance"], result["throughput"]
    print(f"{run_dir}: {result['speculator']['family']} acceptance length {a['mean_acceptance_length']:.2f}, "
          f"{t['spec_tok_s']:.1f} tok/s vs {t['baseline_tok_s']:.1f} plain, speedup {t['speedup']:.2f}x")
    return t["speedup"]  # the objective a sweeper (e.g. Optuna) maximises


def skipped(run_dir: Path, done: Path) -> float | None:
    """Report the completed run that already did this job's work; return its speedup."""
    if done.resolve() != run_dir.resolve():
        run_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(run_dir / RESUMED_FILE, {"completed_run": str(done.resolve())})
    speedup = metric_value(row_of(read_result(done), done.name), "speedup")
    print(f"{run_dir}: already completed in {done} (same config), skipped; speedup {speedup}")
    return speedup


if __name__ == "__main__":
    main()
