"""Successive halving as a Hydra sweeper: train every candidate on a small budget, promote
the best fraction to a larger one, repeat.

Rung r trains the survivors with `budget_key = min_budget * eta**r` (e.g. training
steps), ranks them by a measured figure of their result.json (speedup by default, never
training loss), and promotes the best 1/eta (at least one). It stops when one candidate
is left or after `rungs` rungs. Every decision is written to `<sweep dir>/halving.json`
after each rung (atomically, so the dashboard can show a sweep in progress), and printed
by `speclab sweep`.

It is an ordinary Hydra sweeper (selected with `override /hydra/sweeper: halving`; Hydra
loads it as hydra_plugins.speclab_halving_sweeper, sweeps/hydra_plugin/), so
every job goes through the configured launcher (basic, joblib, submitit) and every job is
a normal run directory; with `resume=skip_completed` a rerun skips finished rungs' jobs.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.plugins import Plugins
from hydra.core.utils import JobReturn, JobStatus
from hydra.plugins.sweeper import Sweeper
from omegaconf import OmegaConf

from .run_rows import METRICS, metric_value, row_of
from .results import RESULT_FILE, read_result, write_json_atomic

log = logging.getLogger(__name__)
DECISIONS_FILE = "halving.json"
RESUMED_FILE = "resumed.json"  # what sweeps/train.py leaves in a skipped job's directory


@dataclass
class Scored:
    overrides: list[str]  # the candidate's own overrides (without the budget)
    run_dir: str | None  # where its result.json is
    value: float | None  # the measured metric; None: failed or unmeasured (ranks last)
    status: str


class SuccessiveHalving(Sweeper):
    def __init__(self, params: dict | None = None, budget_key: str = "training.max_steps",
                 min_budget: int = 8, eta: int = 2, rungs: int = 3, metric: str = "speedup"):
        if eta < 2:
            raise ValueError(f"successive halving needs eta >= 2, got {eta}")
        if metric not in METRICS:
            raise ValueError(f"unknown halving metric {metric!r}; valid: {', '.join(METRICS)}")
        self.params = dict(params or {})
        self.budget_key, self.min_budget, self.eta, self.rungs, self.metric = budget_key, min_budget, eta, rungs, metric
        self.config = self.launcher = self.hydra_context = None

    def setup(self, *, hydra_context, task_function, config) -> None:
        self.hydra_context, self.config = hydra_context, config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config)

    def sweep(self, arguments: list[str]) -> Any:
        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        candidates = self.candidates(arguments)
        record = {"metric": self.metric, "budget_key": self.budget_key, "eta": self.eta,
                  "min_budget": self.min_budget, "candidates": len(candidates), "rungs": [], "winner": None}
        survivors, budget, job_idx = candidates, self.min_budget, 0
        for rung in range(self.rungs):
            batch = [[*c, f"{self.budget_key}={budget}"] for c in survivors]
            returns = self.launcher.launch(batch, initial_job_idx=job_idx)
            job_idx += len(batch)
            scored = [self.score(c, r) for c, r in zip(survivors, returns)]
            last = rung == self.rungs - 1 or len(survivors) == 1
            promoted = [] if last else rank(scored)[: max(1, len(scored) // self.eta)]
            record["rungs"].append({
                "rung": rung, "budget": budget,
                "runs": [{**vars(s), "promoted": any(s is p for p in promoted)} for s in scored],
            })
            if last:
                best = rank(scored)[0]
                record["winner"] = vars(best) if best.value is not None else None
            write_json_atomic(sweep_dir / DECISIONS_FILE, record)
            log.info("halving rung %d (budget %s): %s", rung, budget, format_rung(record["rungs"][-1]))
            if last:
                break
            survivors, budget = [s.overrides for s in promoted], budget * self.eta
        return record

    def candidates(self, arguments: Sequence[str]) -> list[list[str]]:
        """The grid of `params` and command-line sweeps, as lists of override strings."""
        params = [f"{key}={value}" for key, value in self.params.items()] + list(arguments)
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        return BasicSweeper.split_arguments(parser.parse_overrides(params), None)[0]

    def score(self, overrides: list[str], ret: JobReturn) -> Scored:
        run_dir = Path(OmegaConf.select(ret.hydra_cfg, "hydra.runtime.output_dir"))
        if ret.status != JobStatus.COMPLETED:
            return Scored(overrides, str(run_dir), None, "failed")
        done = run_dir
        if not (run_dir / RESULT_FILE).is_file() and (run_dir / RESUMED_FILE).is_file():
            done = Path(read_result_pointer(run_dir))  # skipped: another run did this job
        try:
            result = read_result(done)
        except (FileNotFoundError, ValueError):
            return Scored(overrides, str(done), None, "missing")
        value = metric_value(row_of(result, done.name), self.metric) if result.get("status") == "completed" else None
        return Scored(overrides, str(done), value, str(result.get("status")))


def read_result_pointer(run_dir: Path) -> str:
    import json

    return json.loads((run_dir / RESUMED_FILE).read_text())["completed_run"]


def rank(scored: list[Scored]) -> list[Scored]:
    """Best measured value first; failed or unmeasured candidates last (stable order)."""
    return sorted(scored, key=lambda s: (s.value is None, -(s.value or 0.0)))


def format_rung(rung: dict) -> str:
    cells = []
    for run in rung["runs"]:
        value = "-" if run["value"] is None else format(run["value"], ".3f")
        cells.append(f"{' '.join(run['overrides']) or '(defaults)'} -> {value}{' promoted' if run['promoted'] else ''}")
    return "; ".join(cells)


def read_decisions(path: Path) -> tuple[dict | None, str | None]:
    """A sweep's halving.json if it has the shape the page draws, else (None, why)."""
    if not path.is_file():
        return None, None
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return None, f"{path.name} unreadable: {exc}"
    if not (isinstance(record, dict) and isinstance(record.get("rungs"), list)
            and all(isinstance(r, dict) and isinstance(r.get("runs"), list) for r in record["rungs"])):
        return None, f"{path.name} is not a halving record"
    return record, None


def format_decisions(record: dict) -> str:
    """The promotion decisions as `speclab sweep` prints them."""
    lines = [f"successive halving by {record['metric']} ({record['candidates']} candidates, eta {record['eta']}):"]
    for rung in record["rungs"]:
        lines.append(f"  rung {rung['rung']} ({record['budget_key']}={rung['budget']}):")
        for r in rank([Scored(x["overrides"], x["run_dir"], x["value"], x["status"]) for x in rung["runs"]]):
            flag = next(x["promoted"] for x in rung["runs"] if x["overrides"] == r.overrides)
            value = "-" if r.value is None else f"{r.value:.3f}"
            lines.append(f"    {value:>7}  {'promoted ' if flag else '         '}{' '.join(r.overrides) or '(defaults)'}"
                         f"{'' if r.status == 'completed' else f'  [{r.status}]'}")
    winner = record.get("winner")
    lines.append(f"  winner: {' '.join(winner['overrides']) or '(defaults)'} ({winner['value']:.3f})"
                 if winner else "  winner: none (no candidate was measured)")
    return "\n".join(lines)
