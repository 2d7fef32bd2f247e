"""`speclab sweep NAME [OVERRIDES]`: run the predefined sweep configs/sweep/NAME.yaml.

A sweep config is a Hydra delta (`# @package _global_`) holding `hydra.sweeper.params`
and `hydra.mode: MULTIRUN`, so `speclab sweep quick x=y` is `speclab train +sweep=quick x=y`.
Its runs land in `<runs_dir>/sweep-NAME/`, a directory that stays the same across reruns:
running the same sweep again skips the runs it already completed (sweeps/resume.py).
"""

from __future__ import annotations

import sys
from importlib import resources
from pathlib import Path
from typing import Callable

from .halving import DECISIONS_FILE, format_decisions, read_decisions
from .run_rows import load_rows
from .table import format_table

SWEEP_GROUP = "sweep"
FAILED_RUNS = 1  # exit status of a sweep with failed runs (2 stays a usage error)


def available_sweeps() -> list[str]:
    """The names of configs/sweep/*.yaml (its subfolders hold shared parts and candidates)."""
    folder = resources.files("speclab.configs") / SWEEP_GROUP
    return sorted(p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml"))


def run_sweep(name: str, overrides: list[str], run_train: Callable[[list[str]], int]) -> int:
    """Launch the sweep through `speclab train`'s Hydra entry, then print its summary."""
    if name not in available_sweeps():
        raise ValueError(f"unknown sweep {name!r}; valid: {', '.join(available_sweeps())}")
    code = run_train([f"+{SWEEP_GROUP}={name}", *overrides])
    sweep_dir = sweep_dir_of(name, overrides)
    if sweep_dir is not None and sweep_dir.is_dir():
        print(summary(sweep_dir))
        failed = [row["run_id"] for row in load_rows(sweep_dir) if row["status"] != "completed"]
        if failed:  # a sweep whose runs failed did not succeed, whatever Hydra returned
            print(f"speclab sweep {name}: {len(failed)} run(s) failed: {', '.join(failed)}", file=sys.stderr)
            return code or FAILED_RUNS
    return code


def sweep_dir_of(name: str, overrides: list[str]) -> Path | None:
    """Where the sweep's runs went, as Hydra composes it (None if it cannot be told)."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    try:
        with initialize_config_module("speclab.configs", version_base=None):
            cfg = compose("config", overrides=[f"+{SWEEP_GROUP}={name}", *overrides], return_hydra_config=True)
            return Path(OmegaConf.select(cfg, "hydra.sweep.dir", throw_on_resolution_failure=True))
    except Exception:  # noqa: BLE001 - a summary is a courtesy; the sweep itself already ran
        return None


def summary(sweep_dir: Path) -> str:
    """The sweep's runs table, its resumed jobs, and any successive-halving decisions."""
    rows = load_rows(sweep_dir)
    resumed = sorted(p.parent.name for p in sweep_dir.glob("*/resumed.json"))
    lines = [f"sweep {sweep_dir}: {len(rows)} runs "
             f"({sum(r['status'] == 'completed' for r in rows)} completed), "
             f"{len(resumed)} jobs skipped as already done elsewhere", format_table(rows)]
    record, problem = read_decisions(sweep_dir / DECISIONS_FILE)
    if record is not None:
        try:
            lines += ["", format_decisions(record)]
        except (KeyError, TypeError, ValueError) as exc:  # a hand-edited record: named, not a crash
            problem = f"{DECISIONS_FILE} is not a halving record ({type(exc).__name__}: {exc})"
    if problem:
        lines += ["", f"successive halving: {problem}"]
    return "\n".join(lines)
