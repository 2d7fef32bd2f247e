"""The sweep view's figures: the knobs that vary across runs, their importance, the Pareto front.

A knob is a leaf of a run's resolved config (result.json `config`, dotted keys) whose value
differs between the runs shown; the run's parameter count and training tokens join them as
the size and data-budget axes. Values are encoded for parallel coordinates here, so the page
only hands numbers and tick labels to the chart library.

Importance is the correlation ratio eta^2 of the metric on each knob (ANOVA: the share of
the metric's variance between the groups of runs sharing a knob value), normalised to sum
to 1 as Optuna's evaluators do. Optuna's fANOVA and mean-decrease-impurity evaluators need
scikit-learn, which speclab does not install; eta^2 needs nothing and reads the same way on
a grid sweep. A knob with more distinct values than IMPORTANCE_BINS is grouped by rank into
that many bins first, since a value per run would explain everything trivially.
"""

from __future__ import annotations

import json
import math
from typing import Any

from ..table import is_baseline

IGNORED = ("run_name", "runs_dir", "resume", "wandb.", "hydra.")  # names and plumbing, not knobs
MAX_KNOBS = 10  # with the two metrics, about 100 px an axis on a 1280 px chart: labels stay apart
IMPORTANCE_BINS = 4
METRICS = ("speedup", "acceptance_length")
MISSING = "-"  # a knob a run's config does not have (a training-free run has no learned width)


def flatten(config: Any, prefix: str = "") -> dict[str, Any]:
    """{'a.b': leaf} of a nested dict; lists become their JSON text (a list is one choice)."""
    if not isinstance(config, dict):
        return {}
    out = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
        elif isinstance(value, list):
            out[name] = json.dumps(value)
        elif value is None or isinstance(value, (str, int, float, bool)):
            out[name] = value
    return out


def knob_table(runs: list[dict]) -> dict[str, list]:
    """{knob: value per run} for every config leaf that varies (plus params and tokens)."""
    flat = [{**flatten(r.get("config")), "params": r.get("params"), "train tokens": r.get("train_tokens")}
            for r in runs]
    keys = sorted({k for f in flat for k in f if not any(k == p or k.startswith(p) for p in IGNORED)})
    table = {}
    for key in keys:
        values = [f.get(key, MISSING) for f in flat]
        if len({json.dumps(v) for v in values}) > 1:
            table[key] = values
    return table


def merge_aliases(table: dict[str, list]) -> tuple[dict[str, list], dict[str, list[str]]]:
    """Knobs that split the runs into the same groups are one axis: the first keeps its
    values, the others are listed as its aliases (a family's own keys vary with the family,
    a width with the parameter count). Returns (table of the kept knobs, {kept: aliases})."""
    kept: dict[str, list] = {}
    aliases: dict[str, list[str]] = {}
    by_partition: dict[tuple, str] = {}
    for key, values in table.items():
        seen: dict[str, int] = {}
        partition = tuple(seen.setdefault(json.dumps(v), len(seen)) for v in values)
        if partition in by_partition:
            aliases[by_partition[partition]].append(key)
        else:
            by_partition[partition], kept[key], aliases[key] = key, values, []
    return kept, aliases


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def encode(values: list) -> dict:
    """One parallel-coordinates axis: numbers as they are (log scale where they span 100x or
    more), anything else as categories in sorted order with their labels as ticks."""
    if all(_is_number(v) for v in values):
        positive = all(v > 0 for v in values)
        log = positive and max(values) / min(values) >= 100
        return {"values": [math.log10(v) if log else v for v in values], "log": log, "ticks": None}
    labels = sorted({json.dumps(v) for v in values},
                    key=lambda s: (not _is_number(json.loads(s)), json.loads(s) if _is_number(json.loads(s)) else s))
    index = {s: i for i, s in enumerate(labels)}
    text = [str(json.loads(s)) if isinstance(json.loads(s), str) else s for s in labels]
    return {"values": [index[json.dumps(v)] for v in values], "log": False, "ticks": text}


def eta_squared(groups: list, metric: list[float]) -> float:
    """Between-group variance / total variance of `metric` grouped by `groups`."""
    mean = sum(metric) / len(metric)
    total = sum((m - mean) ** 2 for m in metric)
    if total == 0:
        return 0.0
    by: dict[str, list[float]] = {}
    for g, m in zip(groups, metric):
        by.setdefault(json.dumps(g), []).append(m)
    between = sum(len(ms) * (sum(ms) / len(ms) - mean) ** 2 for ms in by.values())
    return between / total


def binned(values: list) -> list:
    """Values with more than IMPORTANCE_BINS distinct numbers grouped into rank bins."""
    distinct = sorted({v for v in values if _is_number(v)})
    if len(distinct) <= IMPORTANCE_BINS or not all(_is_number(v) for v in values):
        return values
    rank = {v: i for i, v in enumerate(distinct)}
    return [rank[v] * IMPORTANCE_BINS // len(distinct) for v in values]


def importance(table: dict[str, list], metric: list) -> list[dict]:
    """[{knob, score}] best first, scores summing to 1, over runs where the metric is measured."""
    keep = [i for i, m in enumerate(metric) if _is_number(m)]
    if len(keep) < 3:
        return []
    ys = [metric[i] for i in keep]
    raw = {k: eta_squared(binned([v[i] for i in keep]), ys) for k, v in table.items()}
    total = sum(raw.values())
    if total == 0:
        return []
    return sorted(({"knob": k, "score": s / total} for k, s in raw.items()), key=lambda e: -e["score"])


def pareto_front(runs: list[dict], cost: str) -> list[str]:
    """run_dirs on the front of speedup against `cost`: cheapest first, a run joins when it is
    faster than every cheaper one. Runs that count and have a positive cost take part."""
    points = [r for r in runs if r.get("counts") and _is_number(r.get(cost)) and r[cost] > 0
              and _is_number(r.get("speedup"))]
    front, best = [], -math.inf
    for r in sorted(points, key=lambda r: (r[cost], -r["speedup"])):
        if r["speedup"] > best:
            front.append(r["run_dir"])
            best = r["speedup"]
    return front


def sweep_view(runs: list[dict]) -> dict:
    """Axes for parallel coordinates over the counted learned runs, importance per metric,
    Pareto fronts over every counted run. The training-free baselines are left out of the
    knobs: they have no width or data, so each learned knob would 'vary' only through them."""
    counted = [r for r in runs if r.get("counts") and not is_baseline({**r, "result": {"config": r.get("config")}})]
    table, aliases = merge_aliases(knob_table(counted))
    ranked = importance(table, [r.get("speedup") for r in counted])
    order = [e["knob"] for e in ranked] + [k for k in table if k not in {e["knob"] for e in ranked}]
    axes = [{"knob": k, "aliases": aliases[k], **encode(table[k])} for k in order[:MAX_KNOBS]]
    return {
        "run_dirs": [r["run_dir"] for r in counted],
        "axes": axes,
        "metrics": {m: [r.get(m) for r in counted] for m in METRICS},
        "importance": {m: importance(table, [r.get(m) for r in counted]) for m in METRICS},
        "hidden_knobs": order[MAX_KNOBS:],
        "pareto": {cost: pareto_front(runs, cost) for cost in ("draft_ms_per_token", "params")},
    }
