"""`speclab train [OVERRIDES]`: one experiment, or a Hydra multirun with -m.

With `resume=skip_completed` (every predefined sweep sets it) a job whose resolved config
matches a completed run under runs_dir returns that run's measured speedup without
running again (sweeps/resume.py).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from .config_check import ConfigRangeError, check_config
from .job_tasks import build_share, job_task
from .run_rows import metric_value, row_of
from .resume import check_run_dir_free, config_hash, digest, find_completed
from .results import PROCESS_FILE, failed_result, read_result, write_json_atomic, write_result

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
    try:
        check_config(cfg)  # before any work: a bad number fails now, not after the data build
    except ConfigRangeError as exc:
        return invalid(cfg, run_dir, exc, multirun)
    if cfg.resume == "skip_completed":
        wanted = config_hash(OmegaConf.to_container(cfg, resolve=True))
        done = find_completed(cfg.runs_dir, wanted)
        if done is not None:
            return skipped(run_dir, done)
        check_run_dir_free(run_dir, wanted)
    task = job_task()
    if task.rank > 0:  # a job of several tasks: this one builds its shard, task 0 runs
        return build_share(cfg, task)
    from .experiment import run_experiment  # torch, transformers, lightning: not needed to skip

    mark_process(run_dir)
    try:
        with terminated_as_failure():
            result = run_experiment(cfg, run_dir)
    except Terminated as exc:  # result.json already says failed; the whole sweep stops, as on Ctrl-C
        print(f"speclab train: run {run_dir} {exc}", file=sys.stderr)
        sys.exit(128 + signal.SIGTERM)
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


class Terminated(BaseException):
    """SIGTERM, raised in the run's thread so that the run writes its failed result.json
    (as Ctrl-C does) instead of vanishing; a BaseException so no `except Exception` eats it."""


@contextlib.contextmanager
def terminated_as_failure():
    try:
        previous = signal.signal(signal.SIGTERM, _raise_terminated)
    except ValueError:  # not the main thread: signals cannot be caught here
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _raise_terminated(signum, frame):
    raise Terminated("terminated by SIGTERM")


def mark_process(run_dir: Path) -> None:
    """Record which process runs this run, so a reader can tell a dead run from a running one."""
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(run_dir / PROCESS_FILE, {"pid": os.getpid(), "host": socket.gethostname(),
                                               "start_time": time.time()})


def invalid(cfg: DictConfig, run_dir: Path, exc: ConfigRangeError, multirun: bool) -> None:
    """A config value out of range: one line; in a sweep, a failed result.json so the sweep lists it."""
    if not multirun:
        print(f"speclab train: {exc}", file=sys.stderr)
        sys.exit(2)
    log.error("run %s: %s", run_dir, exc)
    run_dir.mkdir(parents=True, exist_ok=True)
    config = OmegaConf.to_container(cfg, resolve=True)
    runs_dir = Path(cfg.runs_dir).resolve()
    run_id = str(run_dir.resolve().relative_to(runs_dir)) if runs_dir in run_dir.resolve().parents else run_dir.name
    write_result(run_dir, failed_result(run_id, config, str(exc)))
    return None


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
