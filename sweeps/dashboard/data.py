"""What the dashboard shows, gathered read-only from a runs directory.

Everything comes from the run directories themselves (result.json, the live
logs/metrics.csv of a run in progress, a sweep's multirun.yaml and halving.json); nothing
is written, so the page can watch a sweep that is running and a runs directory the viewer
may only read. live.py reads what is in progress, knobs.py the sweep view's figures,
detail.py one run's page.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from pathlib import Path
from typing import Any

from ..plot_scaling import points_of
from ..run_rows import load_rows
from ..table import best_baseline, counts, note
from .knobs import sweep_view
from .live import live_entry, read_live_loss, running_dirs, sweeps

MAX_CURVE_POINTS = 400  # loss curves are thinned to this many points (one per pixel or so)


def state(root: Path) -> dict:
    """The page's whole payload: runs (leaderboard, Pareto, acceptance, loss), the sweep view
    and sweeps' progress."""
    rows = load_rows(root) if root.is_dir() else []
    baseline = best_baseline(rows)  # the bar every learned run is read against (table.py)
    runs = [{**run_entry(root, row), "counts": counts(row), "note": note(row, baseline)} for row in rows]
    view = sweep_view([{**run, "config": _dict(row["result"].get("config"))} for run, row in zip(runs, rows)])
    runs += [{**entry, "loss": thin_points(entry["loss"])} for entry in (live_entry(root, d) for d in running_dirs(root))]
    label(runs)
    learned, baselines = points_of(rows)
    return {"root": str(root), "generated_at": time.time(), "runs": runs, "sweeps": sweeps(root),
            "scaling": {"points": learned, "baselines": baselines}, "sweep_view": view}


def label(runs: list[dict]) -> None:
    """Each run's name on the page: its run_id, or its directory where run ids repeat (the
    same sweep run into two runs directories)."""
    seen = Counter(r["run_id"] for r in runs)
    for r in runs:
        r["label"] = r["run_id"] if seen[r["run_id"]] == 1 else r["run_dir"]


def run_entry(root: Path, row: dict) -> dict:
    result = row["result"]
    train = _dict(result.get("train"))
    return {
        "run_dir": row["run_dir"], "run_id": str(row["run_id"]), "status": str(row["status"]),
        "error": row["error"], "family": row["family"], "params": _num(row["params"]),
        "draft_ms_per_token": _num(draft_ms(result)), "acceptance_length": _num(row["acceptance_length"]),
        "acceptance_rate": _num(row["acceptance_rate"]), "per_position": [_num(x) for x in row["per_position"]],
        "speedup": _num(row["speedup"]), "speedup_ci": speedup_ci(row), "tied": bool(row.get("tied_with_leader")),
        "spec_tok_s": _num(row["spec_tok_s"]),
        "baseline_tok_s": _num(row["baseline_tok_s"]), "checked_prompts": row["checked_prompts"],
        "mismatches": row["mismatches"], "train_steps": row["train_steps"], "final_loss": _num(row["final_loss"]),
        "train_tokens": _num(train.get("tokens")), "wall_s": _num(result.get("wall_s")),
        "loss": thin(train.get("loss_history") or read_live_loss(root / row["run_dir"])),
        "events": events(train),
    }


def speedup_ci(row: dict) -> list[float] | None:
    """[lo, hi] of the speedup: the row's own interval where the results table gives one
    (`speedup_ci`), else the run's bootstrap interval (result.json ci.speedup_total)."""
    ci = row.get("speedup_ci")
    if ci is None:
        ci = _dict(row["result"].get("ci")).get("speedup_total")
    if isinstance(ci, (list, tuple)) and len(ci) == 2 and all(_num(v) is not None for v in ci):
        return [float(ci[0]), float(ci[1])]
    return None


def _dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


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


def thin(values: list) -> list[list[float]]:
    """[[step, loss], ...] of a loss per step, at most MAX_CURVE_POINTS of them."""
    return thin_points([[i, v] for i, v in enumerate(values)])


def thin_points(points: list) -> list[list[float]]:
    """[[step, loss], ...] with at most MAX_CURVE_POINTS points (every n-th, the last kept)."""
    points = [[x, v] for x, v in points if _num(v) is not None]
    if len(points) <= MAX_CURVE_POINTS:
        return points
    stride = math.ceil(len(points) / MAX_CURVE_POINTS)
    return points[::stride] + ([points[-1]] if (len(points) - 1) % stride else [])


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return value
