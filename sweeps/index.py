"""The results index: one SQLite row per run, rebuilt from the run directories.

Run directories (on a shared filesystem, written by many SLURM jobs) are the truth;
the index is a cache, so it is always rebuilt from them and never updated in place.
It is written to a temporary file and renamed, so a reader (the dashboard) never sees
a half-built index.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

from .results import EXPORT_MANIFEST, RESULT_FILE, SHARED_FILE_MODE, read_result, result_problem

log = logging.getLogger(__name__)

INDEX_FILE = ".index.sqlite"
# metric name -> (result.json section, field); always a measured figure, never training loss
METRICS: dict[str, tuple[str, str]] = {
    "speedup": ("throughput", "speedup"),
    "acceptance_length": ("acceptance", "mean_acceptance_length"),
}
# SQLite columns besides `per_position` (JSON text) and `raw` (the whole result.json)
COLUMNS = (
    "run_dir", "run_id", "status", "error", "family", "params", "k", "acceptance_rate",
    "acceptance_length", "baseline_tok_s", "spec_tok_s", "speedup", "checked_prompts",
    "mismatches", "train_steps", "final_loss", "checkpoint", "final_weights_sha256",
)


class NoEligibleRunError(ValueError):
    """No run qualifies for `best`: none completed, lossless and measured."""


def find_run_dirs(runs_dir: str | Path) -> list[Path]:
    """Every directory under runs_dir holding a result.json, exports excluded, sorted."""
    root = _existing_dir(runs_dir)
    found = (p.parent for p in root.rglob(RESULT_FILE) if p.is_file())
    return sorted(d for d in found if not (d / EXPORT_MANIFEST).exists())


def load_rows(runs_dir: str | Path) -> list[dict]:
    """One row per run directory: the main columns flattened, plus `result` (the full dict)."""
    root = _existing_dir(runs_dir)
    rows = []
    for run_dir in find_run_dirs(root):
        rel = run_dir.relative_to(root).as_posix()
        try:
            result = read_result(run_dir)
        except ValueError as exc:  # a truncated file from a killed writer, say: shown, not hidden
            log.warning("%s", exc)
            result = {"run_id": run_dir.name, "status": "unreadable", "error": str(exc)}
        problem = result_problem(result) if result["status"] != "unreadable" else None
        if problem:  # skipped by every reader, flagged with the reason, never a crash
            log.warning("%s/%s: %s", run_dir, RESULT_FILE, problem)
            result = {"run_id": run_dir.name, "status": "malformed", "error": f"{RESULT_FILE}: {problem}"}
        rows.append(row_of(result, rel))
    return rows


def row_of(result: dict, run_dir: str) -> dict:
    acceptance = _section(result, "acceptance")
    throughput = _section(result, "throughput")
    lossless = _section(result, "lossless")
    speculator = _section(result, "speculator")
    train = _section(result, "train")
    return {
        "run_dir": run_dir,
        "run_id": result.get("run_id") or run_dir,
        "status": result.get("status"),
        "error": result.get("error"),
        "family": speculator.get("family"),
        "params": speculator.get("params"),
        "k": acceptance.get("k"),
        "acceptance_rate": acceptance.get("acceptance_rate"),
        "acceptance_length": acceptance.get("mean_acceptance_length"),
        "per_position": list(acceptance.get("per_position") or []),
        "baseline_tok_s": throughput.get("baseline_tok_s"),
        "spec_tok_s": throughput.get("spec_tok_s"),
        "speedup": throughput.get("speedup"),
        "checked_prompts": lossless.get("checked_prompts"),
        "mismatches": lossless.get("mismatches"),
        "train_steps": train.get("steps"),
        "final_loss": train.get("final_loss"),
        "checkpoint": result.get("checkpoint"),
        "final_weights_sha256": result.get("final_weights_sha256"),
        "result": result,
    }


def _section(result: dict, key: str) -> dict:
    value = result.get(key)
    return value if isinstance(value, dict) else {}


def rebuild(runs_dir: str | Path, index_path: str | Path | None = None) -> list[dict]:
    """Rescan runs_dir, rewrite the SQLite index (default runs_dir/.index.sqlite), return the rows."""
    root = _existing_dir(runs_dir)
    rows = load_rows(root)
    path = Path(index_path) if index_path else root / INDEX_FILE
    try:
        write_index(rows, path)
    except (OSError, sqlite3.Error) as exc:  # e.g. someone else's read-only runs: the rows still stand
        log.warning("could not write the results index %s: %s", path, exc)
    return rows


def write_index(rows: list[dict], index_path: Path) -> None:
    fd, tmp = tempfile.mkstemp(dir=index_path.parent, prefix=f".{index_path.name}.", suffix=".tmp")
    os.fchmod(fd, SHARED_FILE_MODE)
    os.close(fd)
    try:
        with sqlite3.connect(tmp) as db:
            columns = ", ".join(f'"{c}"' for c in COLUMNS)
            db.execute(f"CREATE TABLE runs ({columns}, per_position TEXT, raw TEXT NOT NULL)")
            marks = ", ".join("?" * (len(COLUMNS) + 2))
            db.executemany(
                f"INSERT INTO runs VALUES ({marks})",
                [[_sql_value(row[c]) for c in COLUMNS]
                 + [json.dumps(row["per_position"]), json.dumps(row["result"])] for row in rows],
            )
        db.close()
        os.replace(tmp, index_path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _sql_value(value: Any) -> Any:
    """SQLite takes numbers, text and NULL; anything else (a malformed field) goes in as JSON."""
    if value is None or isinstance(value, (int, float, str)):
        return value
    return json.dumps(value)


def read_index(index_path: str | Path) -> list[dict]:
    """The full results (raw result.json dicts, with `run_dir`) stored in an index."""
    path = Path(index_path)
    if not path.is_file():
        raise FileNotFoundError(f"results index {path} does not exist; run `speclab runs` to build it")
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        stored = db.execute("SELECT run_dir, raw FROM runs ORDER BY run_dir").fetchall()
    db.close()
    return [row_of(json.loads(raw), run_dir) for run_dir, raw in stored]


# --- choosing the best run ----------------------------------------------------------------


def metric_value(row: dict, metric: str) -> float | None:
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; valid: {', '.join(METRICS)}")
    section, field = METRICS[metric]
    value = _section(row["result"], section).get(field)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def is_eligible(row: dict, metric: str) -> bool:
    """Completed, checked lossless on at least one prompt with no mismatch, metric measured.

    A run whose output was never compared with plain decoding is not known to be lossless.
    """
    checked, mismatches = row["checked_prompts"], row["mismatches"]
    return (
        row["status"] == "completed"
        and isinstance(checked, int) and checked > 0
        and mismatches == 0
        and metric_value(row, metric) is not None
    )


def best(runs_dir: str | Path, metric: str = "speedup") -> dict:
    """The eligible run with the highest measured `metric` (ties: the first run directory)."""
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; valid: {', '.join(METRICS)}")
    rows = rebuild(runs_dir)
    eligible = [row for row in rows if is_eligible(row, metric)]
    if not eligible:
        raise NoEligibleRunError(
            f"no completed, lossless run with a measured {metric} under {runs_dir} "
            f"({_census(rows)})"
        )
    return max(eligible, key=lambda row: metric_value(row, metric))


def _census(rows: list[dict]) -> str:
    if not rows:
        return f"no {RESULT_FILE} found"
    failed = sum(row["status"] != "completed" for row in rows)
    mismatched = sum(row["status"] == "completed" and bool(row["mismatches"]) for row in rows)
    unchecked = sum(row["status"] == "completed" and not row["checked_prompts"] for row in rows)
    return f"{len(rows)} runs: {failed} not completed, {mismatched} with lossless mismatches, " \
           f"{unchecked} never checked"


def _existing_dir(path: str | Path) -> Path:
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"runs directory {path} does not exist")
    return path
