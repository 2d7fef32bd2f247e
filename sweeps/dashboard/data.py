"""What the dashboard shows, gathered read-only from a runs directory.

Everything comes from the run directories themselves (result.json, the live
logs/metrics.csv of a run in progress, a sweep's multirun.yaml and halving.json); nothing
is written, so the page can watch a sweep that is running and a runs directory the viewer
may only read.
"""

from __future__ import annotations

import csv
import json
import math
import os
import socket
import time
from pathlib import Path
from typing import Any

from ..halving import DECISIONS_FILE, read_decisions
from ..run_rows import find_run_dirs, load_rows
from ..plot_scaling import points_of
from ..results import PROCESS_FILE, RESULT_FILE, result_problem
from ..table import best_baseline, counts, note

MAX_CURVE_POINTS = 400  # loss curves are thinned to this many points (the page draws SVG)
SWEEP_FILES = ("multirun.yaml", "optimization_results.yaml")  # Hydra's sweepers / Optuna's, at a sweep's root
RESUMED_FILE = "resumed.json"
METRICS_CSV = Path("logs") / "metrics.csv"


def state(root: Path) -> dict:
    """The page's whole payload: runs (leaderboard, Pareto, acceptance, loss) and sweeps."""
    rows = load_rows(root) if root.is_dir() else []
    baseline = best_baseline(rows)  # the bar every learned run is read against (table.py)
    runs = [{**run_entry(root, row), "counts": counts(row), "note": note(row, baseline)} for row in rows]
    runs += [live_entry(root, d) for d in running_dirs(root)]
    learned, baselines = points_of(rows)
    return {"root": str(root), "generated_at": time.time(), "runs": runs, "sweeps": sweeps(root),
            "scaling": {"points": learned, "baselines": baselines}}


def run_entry(root: Path, row: dict) -> dict:
    result = row["result"]
    train = result.get("train") if isinstance(result.get("train"), dict) else {}
    return {
        "run_dir": row["run_dir"], "run_id": str(row["run_id"]), "status": str(row["status"]),
        "error": row["error"], "family": row["family"], "params": _num(row["params"]),
        "draft_ms_per_token": _num(draft_ms(result)), "acceptance_length": _num(row["acceptance_length"]),
        "acceptance_rate": _num(row["acceptance_rate"]), "per_position": [_num(x) for x in row["per_position"]],
        "speedup": _num(row["speedup"]), "spec_tok_s": _num(row["spec_tok_s"]),
        "baseline_tok_s": _num(row["baseline_tok_s"]), "checked_prompts": row["checked_prompts"],
        "mismatches": row["mismatches"], "train_steps": row["train_steps"], "final_loss": _num(row["final_loss"]),
        "loss": thin(train.get("loss_history") or read_live_loss(root / row["run_dir"])),
        "events": events(train),
    }


def live_entry(root: Path, run_dir: Path) -> dict:
    """A job that started (Hydra wrote .hydra/) but has no result.json yet: running, or dead."""
    rel = run_dir.relative_to(root).as_posix()
    dead = gone(run_dir)
    return {"run_dir": rel, "run_id": rel, "status": "dead" if dead else "running", "error": dead,
            "family": None, "params": None,
            "draft_ms_per_token": None, "acceptance_length": None, "acceptance_rate": None, "per_position": [],
            "speedup": None, "spec_tok_s": None, "baseline_tok_s": None, "checked_prompts": None,
            "mismatches": None, "train_steps": None, "final_loss": None,
            "loss": thin(read_live_loss(run_dir)), "events": []}


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


def draft_ms(result: dict) -> Any:
    """The draft's measured cost per drafted token (result.json's `timing` block)."""
    timing = result.get("timing")
    return timing.get("draft_ms_per_token") if isinstance(timing, dict) else None


def events(train: dict) -> list[dict]:
    """Spike, rollback and restart markers of a loss curve, from the watchdog and supervisor."""
    out = []
    for record in train.get("rollback_log") or []:
        if not isinstance(record, dict):
            continue
        if isinstance(record.get("onset"), int):
            out.append({"step": record["onset"], "kind": "spike", "reason": str(record.get("reason", ""))})
        if isinstance(record.get("target"), int):
            out.append({"step": record["target"], "kind": "rollback", "reason": str(record.get("reason", ""))})
    for attempt in (train.get("attempts") or [])[1:]:
        if isinstance(attempt, dict) and isinstance(attempt.get("resumed_from"), int):
            out.append({"step": attempt["resumed_from"], "kind": "restart", "reason": str(attempt.get("reason") or "")})
    return out


def read_live_loss(run_dir: Path) -> list[float]:
    """train/loss per logged step from Lightning's CSV log (a run still training)."""
    path = run_dir / METRICS_CSV
    if not path.is_file():
        return []
    try:
        with path.open(newline="") as f:
            return [float(r["train/loss"]) for r in csv.DictReader(f) if r.get("train/loss")]
    except (OSError, ValueError, KeyError, csv.Error):
        return []


def running_dirs(root: Path) -> list[Path]:
    if not root.is_dir():
        return []
    done = set(find_run_dirs(root))
    started = (p.parent for p in root.rglob(".hydra") if p.is_dir())
    return sorted(d for d in started if d not in done and not (d / RESUMED_FILE).exists())


def sweeps(root: Path) -> list[dict]:
    """Progress of every sweep (a directory holding multirun.yaml) and its halving decisions."""
    out = []
    found = {m.parent for name in SWEEP_FILES for m in root.rglob(name)} if root.is_dir() else set()
    for sweep in sorted(found):
        jobs = [d for d in sweep.iterdir() if (d / ".hydra").is_dir()]
        statuses = [_status(d) for d in jobs]
        entry = {"sweep_dir": sweep.relative_to(root).as_posix(), "jobs": len(jobs),
                 **{s: statuses.count(s) for s in ("completed", "failed", "running", "resumed")}, "halving": None}
        entry["halving"], entry["halving_error"] = read_decisions(sweep / DECISIONS_FILE)
        out.append(entry)
    return out


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


def thin(values: list) -> list[list[float]]:
    """[[step, loss], ...] with at most MAX_CURVE_POINTS points (every n-th, the last kept)."""
    points = [[i, v] for i, v in enumerate(values) if _num(v) is not None]
    if len(points) <= MAX_CURVE_POINTS:
        return points
    stride = math.ceil(len(points) / MAX_CURVE_POINTS)
    return points[::stride] + ([points[-1]] if (len(points) - 1) % stride else [])


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return value
