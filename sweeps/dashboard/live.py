"""What is happening now under a runs directory: jobs training, dead, queued, time left.

A job Hydra started has a `.hydra/` folder; until its result.json exists it is training
(or dead, when its recorded process is gone). Its loss comes from Lightning's CSV log as it
is written. A sweep's planned size comes from its multirun.yaml (the basic sweeper's value
lists, or Optuna's n_trials): the jobs not started yet are queued.

Time left: a training job's remaining steps at its measured step rate (when its config sets
training.max_steps); a sweep's, its longest running job's plus the queued jobs at the mean
wall time of its finished ones, as many at once as are running now. Estimates, shown as such.
"""

from __future__ import annotations

import csv
import json
import math
import os
import socket
import time
from pathlib import Path

import yaml

from ..halving import DECISIONS_FILE, read_decisions
from ..results import PROCESS_FILE, RESULT_FILE, result_problem
from ..run_rows import find_run_dirs

SWEEP_FILES = ("multirun.yaml", "optimization_results.yaml")  # Hydra's sweepers / Optuna's, at a sweep's root
RESUMED_FILE = "resumed.json"
METRICS_CSV = Path("logs") / "metrics.csv"
HYDRA_CONFIG = Path(".hydra") / "config.yaml"


def live_entry(root: Path, run_dir: Path) -> dict:
    """A job that started (Hydra wrote .hydra/) but has no result.json yet: running, or dead."""
    rel = run_dir.relative_to(root).as_posix()
    dead = gone(run_dir)
    return {"run_dir": rel, "run_id": rel, "status": "dead" if dead else "running", "error": dead,
            "family": _family(run_dir), "params": None,
            "draft_ms_per_token": None, "acceptance_length": None, "acceptance_rate": None, "per_position": [],
            "speedup": None, "spec_tok_s": None, "baseline_tok_s": None, "checked_prompts": None,
            "mismatches": None, "train_steps": None, "final_loss": None,
            "loss": read_live_curve(run_dir), "events": [], "progress": None if dead else progress(run_dir)}


def gone(run_dir: Path) -> str | None:
    """Why a run without result.json is dead (its recorded process no longer exists), or None.

    Only a process of this machine can be checked; one on another node (a SLURM job) is
    taken as running, since its pid means nothing here.
    """
    try:
        owner = json.loads((run_dir / PROCESS_FILE).read_text())
        pid, host = int(owner["pid"]), str(owner["host"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if host != socket.gethostname():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return f"its process {pid} ended without writing {RESULT_FILE} (killed)"
    except PermissionError:  # alive, another user's
        return None
    return None


def _metrics(run_dir: Path) -> list[dict]:
    path = run_dir / METRICS_CSV
    if not path.is_file():
        return []
    try:
        with path.open(newline="") as f:
            return list(csv.DictReader(f))
    except (OSError, csv.Error):
        return []


def read_live_loss(run_dir: Path) -> list[float]:
    """train/loss per logged row of Lightning's CSV log (a run still training)."""
    try:
        return [float(r["train/loss"]) for r in _metrics(run_dir) if r.get("train/loss")]
    except (ValueError, KeyError):
        return []


def read_live_curve(run_dir: Path) -> list[list[float]]:
    """[[step, train/loss], ...] from Lightning's CSV log, at the steps it was logged."""
    out = []
    for i, r in enumerate(_metrics(run_dir)):
        try:
            if r.get("train/loss"):
                out.append([int(r["step"]) if r.get("step") else i, float(r["train/loss"])])
        except (ValueError, TypeError):
            continue
    return out


def _config(run_dir: Path) -> dict:
    """The job's composed config, read as plain data (never resolved or instantiated)."""
    try:
        config = yaml.safe_load((run_dir / HYDRA_CONFIG).read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return config if isinstance(config, dict) else {}


def _family(run_dir: Path) -> str | None:
    speculator = _config(run_dir).get("speculator")
    family = speculator.get("family") if isinstance(speculator, dict) else None
    return family if isinstance(family, str) else None


def progress(run_dir: Path, now: float | None = None) -> dict:
    """{step, max_steps, elapsed_s, eta_s} of a training job (None where unknown)."""
    steps = []
    for r in _metrics(run_dir):
        try:
            steps.append(int(r["step"]))
        except (KeyError, TypeError, ValueError):
            continue
    step = max(steps) + 1 if steps else 0
    training = _config(run_dir).get("training")
    max_steps = training.get("max_steps") if isinstance(training, dict) else None
    max_steps = max_steps if isinstance(max_steps, int) and not isinstance(max_steps, bool) and max_steps > 0 else None
    try:
        started = (run_dir / ".hydra").stat().st_mtime
        logged = (run_dir / METRICS_CSV).stat().st_mtime
    except OSError:
        return {"step": step, "max_steps": max_steps, "elapsed_s": None, "eta_s": None}
    elapsed = (now or time.time()) - started
    rate = step / (logged - started) if step and logged > started else None
    eta = (max_steps - step) / rate if rate and max_steps else None
    return {"step": step, "max_steps": max_steps, "elapsed_s": elapsed, "eta_s": max(eta, 0.0) if eta is not None else None}


def running_dirs(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    done = set(find_run_dirs(root))
    started = (p.parent for p in root.rglob(".hydra") if p.is_dir())
    return sorted(d for d in started if d not in done and not (d / RESUMED_FILE).exists())


def planned_jobs(sweep: Path) -> int | None:
    """How many jobs the sweep will launch: the product of the basic sweeper's value lists,
    or Optuna's n_trials; None when the file says neither."""
    try:
        config = yaml.safe_load((sweep / "multirun.yaml").read_text())
        sweeper = config["hydra"]["sweeper"]
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return None
    if not isinstance(sweeper, dict):
        return None
    if isinstance(sweeper.get("n_trials"), int):
        return sweeper["n_trials"]
    params = sweeper.get("params")
    if not isinstance(params, dict) or not params:
        return None
    # a value list "a,b,c" is 3 jobs; range()/choice() sweeps are left unplanned
    if any(not isinstance(v, (str, int, float)) or "(" in str(v) for v in params.values()):
        return None
    return math.prod(len(str(v).split(",")) for v in params.values())


def sweeps(root: Path) -> list[dict]:
    """Progress of every sweep (a directory holding multirun.yaml), its halving decisions and
    an estimate of its time left."""
    out = []
    found = {m.parent for name in SWEEP_FILES for m in root.rglob(name)} if root.is_dir() else set()
    for sweep in sorted(found):
        jobs = [d for d in sweep.iterdir() if (d / ".hydra").is_dir()]
        statuses = [_status(d) for d in jobs]
        planned = planned_jobs(sweep)
        entry = {"sweep_dir": sweep.relative_to(root).as_posix(), "jobs": len(jobs),
                 **{s: statuses.count(s) for s in ("completed", "failed", "running", "resumed")},
                 "queued": max(planned - len(jobs), 0) if planned is not None else None, "halving": None}
        entry["eta_s"] = sweep_eta(jobs, statuses, entry["queued"])
        entry["halving"], entry["halving_error"] = read_decisions(sweep / DECISIONS_FILE)
        out.append(entry)
    return out


def sweep_eta(jobs: list[Path], statuses: list[str], queued: int | None) -> float | None:
    """Seconds until the sweep's last job ends (module docstring), or None where unknown."""
    running = [j for j, s in zip(jobs, statuses) if s == "running"]
    if queued is None:  # its size is not known: neither is its end
        return None
    if not running and not queued:
        return 0.0
    walls = []
    for job, status in zip(jobs, statuses):
        if status == "completed":
            try:
                wall = json.loads((job / RESULT_FILE).read_text()).get("wall_s")
            except (OSError, ValueError, AttributeError):
                continue
            if isinstance(wall, (int, float)) and math.isfinite(wall):
                walls.append(wall)
    etas = [progress(j)["eta_s"] for j in running]
    if any(e is None for e in etas) or (queued and not walls):
        return None
    at_once = max(len(running), 1)
    return max(etas, default=0.0) + (queued or 0) * (sum(walls) / len(walls) if walls else 0.0) / at_once


def _status(job: Path) -> str:
    if (job / RESULT_FILE).is_file():
        try:
            result = json.loads((job / RESULT_FILE).read_text())
        except (OSError, ValueError):
            return "failed"
        return "completed" if result_problem(result) is None and result["status"] == "completed" else "failed"
    if (job / RESUMED_FILE).is_file():
        return "resumed"
    return "failed" if gone(job) else "running"  # a dead job will never finish: it counts as failed
