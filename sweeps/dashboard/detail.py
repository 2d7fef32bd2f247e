"""One run's page: everything its result.json records, shaped for the page's figures.

The run is looked up by its directory name among the run directories found under the
runs root (run_rows.find_run_dirs, live.running_dirs): a name that is not one of them gets
nothing, so no request can reach a file outside the runs' own records.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..results import EXPORT_MANIFEST, read_result, result_problem
from ..run_rows import find_run_dirs
from .data import _dict, _num, draft_ms, events, speedup_ci, thin, thin_points
from .knobs import flatten
from .live import live_entry, running_dirs


def find_run(root: Path, rel: str) -> tuple[Path, bool] | None:
    """(run directory, finished) of the run named `rel`, or None: the name must equal one
    found by walking the root; it is never joined onto a path."""
    if not root.is_dir():
        return None
    for run_dir in find_run_dirs(root):
        if run_dir.relative_to(root).as_posix() == rel:
            return run_dir, True
    for run_dir in running_dirs(root):
        if run_dir.relative_to(root).as_posix() == rel:
            return run_dir, False
    return None


def run_detail(root: Path, rel: str) -> dict | None:
    found = find_run(root, rel)
    if found is None:
        return None
    run_dir, finished = found
    if not finished:
        entry = live_entry(root, run_dir)
        return {"run_dir": rel, "run_id": rel, "status": entry["status"], "error": entry["error"],
                "progress": entry.get("progress"), "loss": thin_points(entry["loss"]), "events": [], "config": {}}
    try:
        result = read_result(run_dir)
    except ValueError as exc:
        return {"run_dir": rel, "run_id": rel, "status": "unreadable", "error": str(exc), "config": {}}
    problem = result_problem(result)
    if problem:
        return {"run_dir": rel, "run_id": rel, "status": "malformed", "error": problem, "config": {}}
    return shape(root, run_dir, rel, result)


def shape(root: Path, run_dir: Path, rel: str, result: dict) -> dict:
    train, acceptance = _dict(result.get("train")), _dict(result.get("acceptance"))
    return {
        "run_dir": rel, "run_id": str(result.get("run_id") or rel), "status": str(result.get("status")),
        "error": result.get("error"), "config": _dict(result.get("config")),
        "speculator": _dict(result.get("speculator")),
        "summary": summary(result),
        "per_position": [_num(x) for x in acceptance.get("per_position") or []],
        "per_prompt": per_prompt(result), "per_category": per_category(per_prompt(result)),
        "method": method(result),
        "loss": thin(train.get("loss_history") or []), "events": events(train),
        "train": {k: v for k, v in flatten(train).items() if not k.startswith(("loss_history", "rollback_log",
                                                                                 "attempts", "samples"))},
        "data": flatten(_dict(result.get("data"))),
        "lossless": {**flatten(_dict(result.get("lossless"))),
                     **{"contamination." + k: v for k, v in flatten(_dict(result.get("contamination"))).items()
                        if not k.startswith("per_prompt")}},
        "paths": paths(root, run_dir, result),
    }


def summary(result: dict) -> dict:
    throughput, acceptance = _dict(result.get("throughput")), _dict(result.get("acceptance"))
    return {"speedup": _num(throughput.get("speedup")), "speedup_ci": speedup_ci({"result": result}),
            "acceptance_length": _num(acceptance.get("mean_acceptance_length")),
            "acceptance_rate": _num(acceptance.get("acceptance_rate")), "k": acceptance.get("k"),
            "spec_tok_s": _num(throughput.get("spec_tok_s")), "baseline_tok_s": _num(throughput.get("baseline_tok_s")),
            "draft_ms_per_token": _num(draft_ms(result)), "wall_s": _num(result.get("wall_s"))}


def per_prompt(result: dict) -> list[dict]:
    out = []
    for i, p in enumerate(_dict(result.get("eval")).get("per_prompt") or []):
        if not isinstance(p, dict):
            continue
        base, spec = _num(p.get("baseline_tok_s")), _num(p.get("spec_tok_s"))
        out.append({"prompt": i, "category": p.get("category") if isinstance(p.get("category"), str) else None,
                    "speedup": spec / base if base and spec is not None else None,
                    "acceptance_length": _num(p.get("mean_acceptance_length")),
                    "lossless": p.get("lossless") if isinstance(p.get("lossless"), bool) else None})
    return out


def per_category(prompts: list[dict]) -> list[dict]:
    """Mean speedup and acceptance length per prompt category, where the prompts name one."""
    groups: dict[str, list[dict]] = {}
    for p in prompts:
        if p["category"] is not None:
            groups.setdefault(p["category"], []).append(p)
    return [{"category": c, "prompts": len(ps), "speedup": _mean(p["speedup"] for p in ps),
             "acceptance_length": _mean(p["acceptance_length"] for p in ps)} for c, ps in sorted(groups.items())]


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def method(result: dict) -> dict:
    """The drafting method chosen, the candidates it was chosen from and the verification
    cost curve (ms to verify n tokens) their speeds were predicted with."""
    m = _dict(result.get("method"))
    cost = _dict(m.get("verify_cost_ms"))
    curve = sorted([int(n), _num(ms)] for n, ms in cost.items() if str(n).isdigit() and _num(ms) is not None)
    candidates = [{"label": label(c), "tok_s": _num(c.get("tok_s")), "acceptance_length": _num(c.get("acceptance_length"))}
                  for c in m.get("candidates") or [] if isinstance(c, dict)]
    chosen = _dict(m.get("chosen"))
    return {"verify_cost_ms": curve, "source": m.get("verify_cost_source"), "candidates": candidates,
            "chosen": label(chosen) if chosen else None}


def label(candidate: dict) -> str:
    """'chain k=4' or 'tree union d=8 top_k=4 budget=10'."""
    if candidate.get("kind") == "tree":
        return (f"tree {candidate.get('shape', '')} d={candidate.get('depth')} top_k={candidate.get('top_k')}"
                f" budget={candidate.get('budget')}")
    return f"{candidate.get('kind', '?')} k={candidate.get('k')}"


def paths(root: Path, run_dir: Path, result: dict) -> dict:
    """Where the run's checkpoint and exports are (shown as paths, never served), spelled from
    the runs directory as the dashboard was given it."""
    out = {"run_dir": str(run_dir)}
    checkpoint = result.get("checkpoint")
    if isinstance(checkpoint, str) and checkpoint:
        out["checkpoint"] = str(run_dir / checkpoint)
    exports = []
    for manifest in root.rglob(EXPORT_MANIFEST):
        try:
            source = json.loads(manifest.read_text()).get("source_run_dir")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(source, str) and Path(source).resolve() == run_dir.resolve():
            exports.append(str(manifest.parent))
    out["exports"] = sorted(exports)
    return out
