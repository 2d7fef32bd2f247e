"""The results as rows: one per run directory, read from its result.json each time.

Run directories (on a shared filesystem, written by many SLURM jobs) are the only record:
`speclab runs`, the dashboard, the sweep summaries, halving and `export --best` all read
them through `load_rows`, so no copy of them can go stale.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

from speclab.eval.paired import keyed, speedup_interval, verdict

from .results import EXPORT_MANIFEST, RESULT_FILE, read_result, result_problem

log = logging.getLogger(__name__)

# metric name -> (result.json section, field); always a measured figure, never training loss
METRICS: dict[str, tuple[str, str]] = {
    "speedup": ("throughput", "speedup"),
    "acceptance_length": ("acceptance", "mean_acceptance_length"),
}


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
    return mark_ties(rows)


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
        "speedup_ci": speedup_ci(result),
        "tied_with_leader": False,  # set over all rows by mark_ties
        "checked_prompts": lossless.get("checked_prompts"),
        "mismatches": lossless.get("mismatches"),
        "train_steps": train.get("steps"),
        "final_loss": train.get("final_loss"),
        "checkpoint": result.get("checkpoint"),
        "final_weights_sha256": result.get("final_weights_sha256"),
        "result": result,
    }


def per_prompt(result: dict) -> list:
    """result.json's per-prompt records (eval.per_prompt), [] where absent or malformed."""
    records = _section(result, "eval").get("per_prompt")
    return records if isinstance(records, list) else []


def speedup_ci(result: dict) -> list[float] | None:
    """[lo, hi] of the run's speedup: the interval its scoring recorded (ci.speedup_total,
    the same pooled speedup as throughput.speedup), else one bootstrapped from its per-prompt
    records (eval/paired.py), else None."""
    recorded = _section(result, "ci").get("speedup_total")
    if isinstance(recorded, list) and len(recorded) == 2 and all(_finite(v) for v in recorded):
        return [float(v) for v in recorded]
    figures = list(keyed(per_prompt(result)).values())
    return speedup_interval(figures) if figures else None


def versus(row: dict, other: dict) -> dict | None:
    """eval/paired.verdict of two rows: paired over their shared prompts, else by their
    intervals' overlap; None when their records hold neither."""
    return verdict(keyed(per_prompt(row["result"])), row.get("speedup_ci"),
                   keyed(per_prompt(other["result"])), other.get("speedup_ci"))


def leader(rows: list[dict]) -> dict | None:
    """The counted run (completed, lossless, speedup measured) with the highest speedup."""
    eligible = [row for row in rows if is_eligible(row, "speedup")]
    return max(eligible, key=lambda row: metric_value(row, "speedup")) if eligible else None


def mark_ties(rows: list[dict]) -> list[dict]:
    """Set each row's `tied_with_leader` (docs/design.md, "Winners only where the intervals
    say so"): a counted run the leader's paired interval does not separate from it. The leader
    is marked `leader`; where the records cannot tell (no per-prompt figures, no intervals),
    `vs_leader` is None and the run is not marked tied."""
    top = leader(rows)
    for row in rows:
        row["leader"] = row is top
        row["tied_with_leader"] = False
        if top is None or row is top or not is_eligible(row, "speedup"):
            continue
        found = versus(row, top)
        row["tied_with_leader"] = bool(found and found["tied"])
        row["vs_leader"] = found
    return rows


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _section(result: dict, key: str) -> dict:
    value = result.get(key)
    return value if isinstance(value, dict) else {}


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
    rows = load_rows(runs_dir)
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
