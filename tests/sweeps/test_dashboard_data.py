"""The dashboard's data side: knobs and their importance, the Pareto front, the run page's
payload, live progress and the speedup intervals."""

import json
import os
import time

import pytest
from dashboard_runs import generate

from speclab.sweeps.dashboard.data import run_entry, speedup_ci, state
from speclab.sweeps.dashboard.detail import find_run, run_detail
from speclab.sweeps.dashboard.knobs import (encode, eta_squared, flatten, importance, knob_table, merge_aliases,
                                            pareto_front)
from speclab.sweeps.dashboard.live import planned_jobs, progress
from speclab.sweeps.run_rows import load_rows


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    root = tmp_path_factory.mktemp("data") / "runs"
    return root, generate(root, runs=18)


def test_flatten_and_the_knobs_that_vary():
    assert flatten({"a": {"b": 1, "c": [1, 2]}, "d": None}) == {"a.b": 1, "a.c": "[1, 2]", "d": None}
    runs = [{"config": {"speculator": {"family": f, "width": w}, "seed": 0, "run_name": n}, "params": p}
            for f, w, n, p in [("mlp", 256, "x", 1), ("mlp", 512, "y", 2), ("eagle3", 256, "z", 3)]]
    table = knob_table(runs)
    assert set(table) == {"speculator.family", "speculator.width", "params"}  # seed constant, run_name ignored
    assert table["speculator.width"] == [256, 512, 256]


def test_knobs_that_split_runs_alike_are_one_axis():
    kept, aliases = merge_aliases({"family": ["a", "a", "b"], "width": [1, 1, 2], "lr": [1, 2, 2], "dim": [8, 9, 9]})
    assert list(kept) == ["family", "lr"] and aliases == {"family": ["width"], "lr": ["dim"]}


def test_encode_numbers_categories_and_log_axes():
    assert encode([256, 512, 1024]) == {"values": [256, 512, 1024], "log": False, "ticks": None}
    wide = encode([1_000, 100_000, 10_000_000])
    assert wide["log"] and wide["values"] == pytest.approx([3, 5, 7])
    mixed = encode(["mlp", 4, "-", 2])  # numbers first in order, then text
    assert mixed["ticks"] == ["2", "4", "-", "mlp"] and mixed["values"] == [3, 1, 2, 0]


def test_importance_is_the_share_of_variance_each_knob_explains():
    assert eta_squared(["a", "a", "b", "b"], [1.0, 1.0, 2.0, 2.0]) == 1.0
    assert eta_squared(["a", "b", "a", "b"], [1.0, 1.0, 2.0, 2.0]) == 0.0
    table = {"width": [1, 1, 2, 2], "seed": [0, 1, 0, 1]}
    ranked = importance(table, [1.0, 1.1, 2.0, 2.1])
    assert [e["knob"] for e in ranked] == ["width", "seed"]
    assert sum(e["score"] for e in ranked) == pytest.approx(1.0) and ranked[0]["score"] > 0.95
    assert importance(table, [1.0, None, None, 2.0]) == []  # fewer than 3 measured runs


def test_pareto_front_includes_runs_without_parameters_by_draft_cost():
    runs = [{"run_dir": d, "counts": c, "params": p, "draft_ms_per_token": ms, "speedup": s}
            for d, c, p, ms, s in [("ngram", True, 0, 0.02, 1.3), ("small", True, 1e6, 0.2, 1.4),
                                   ("slow", True, 2e6, 0.5, 1.35), ("big", True, 9e6, 0.6, 1.6),
                                   ("lossy", False, 1e6, 0.1, 3.0)]]
    assert pareto_front(runs, "draft_ms_per_token") == ["ngram", "small", "big"]
    assert pareto_front(runs, "params") == ["small", "big"]  # 0 parameters: no place on a log axis


def test_state_carries_intervals_ties_and_the_sweep_view(generated):
    root, _ = generated
    payload = state(root)
    by_dir = {r["run_dir"]: r for r in payload["runs"]}
    first = by_dir["sweep-grid/0-mlp-256-30000"]
    assert first["speedup_ci"] == pytest.approx([first["speedup"] - 0.1, first["speedup"] + 0.1])
    assert first["tied"] is False
    view = payload["sweep_view"]
    axes = {a["knob"]: a["aliases"] for a in view["axes"]}
    # a width splits the runs as the parameter count does, a data budget as the tokens trained on
    assert axes == {"speculator.family": [], "params": ["speculator.inner_dim"], "data.max_tokens": ["train tokens"]}
    assert len(view["run_dirs"]) == 18  # the learned runs that count: baselines, failed, broken left out
    assert len(view["pareto"]["draft_ms_per_token"]) >= 2 and "sweep-grid/baseline-ngram" in view["pareto"]["draft_ms_per_token"]
    assert view["importance"]["speedup"][0]["score"] > 0
    (sweep,) = payload["sweeps"]
    assert (sweep["jobs"], sweep["completed"], sweep["failed"], sweep["running"]) == (20, 18, 1, 1)
    assert sweep["queued"] == 3 * 3 * 3 * 2 - 20  # families x seeds x widths x budgets, less the jobs started


def test_a_rows_own_interval_and_tie_come_first(generated):
    root, _ = generated
    row = next(r for r in load_rows(root) if r["run_dir"] == "sweep-grid/0-mlp-256-30000")
    assert speedup_ci({**row, "speedup_ci": [1.0, 2.0]}) == [1.0, 2.0]
    assert speedup_ci({**row, "speedup_ci": None}) == row["result"]["ci"]["speedup_total"]  # else the run's own
    assert speedup_ci({**row, "speedup_ci": None, "result": {}}) is None
    assert run_entry(root, {**row, "tied_with_leader": True})["tied"] is True


def test_run_page_payload(generated):
    root, special = generated
    page = run_detail(root, "sweep-grid/0-mlp-256-30000")
    assert page["config"]["speculator"]["inner_dim"] == 256
    assert [c["category"] for c in page["per_category"]] == ["chat", "code"]
    assert page["per_category"][0]["prompts"] == 2 and len(page["per_prompt"]) == 4
    assert page["method"]["verify_cost_ms"][0] == [1, 10.0] and page["method"]["chosen"].startswith("tree union")
    assert len(page["method"]["candidates"]) == 4 and len(page["loss"]) == 100
    assert sorted(e["kind"] for e in page["events"]) == ["restart", "rollback", "spike"]
    assert page["data"]["cache.tokens"] == 30_000 and page["lossless"]["mismatches"] == 0
    assert page["paths"]["checkpoint"].endswith("checkpoints/speculator")
    assert page["paths"]["exports"] == [str(special["export"])]
    assert run_detail(root, "broken")["status"] == "malformed"
    assert run_detail(root, special["training"].relative_to(root).as_posix())["status"] == "running"


def test_run_page_is_found_only_by_a_listed_name(generated):
    root, _ = generated
    for name in ("", ".", "..", "../runs", "/etc", str(root / "sweep-grid" / "0-mlp-256-30000"),
                 "sweep-grid/./0-mlp-256-30000", "sweep-grid", "exported/best"):
        assert find_run(root, name) is None, name


def test_progress_and_time_left(tmp_path):
    run = tmp_path / "job"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text("training:\n  max_steps: 100\n")
    (run / "logs").mkdir()
    (run / "logs" / "metrics.csv").write_text("step,train/loss\n4,3.0\n9,2.5\n19,2.0\n")
    started = time.time() - 100
    os.utime(run / ".hydra", (started, started))
    os.utime(run / "logs" / "metrics.csv", (started + 40, started + 40))  # 20 steps in 40 s
    p = progress(run)
    assert p["step"] == 20 and p["max_steps"] == 100
    assert p["eta_s"] == pytest.approx(160, rel=1e-3)  # 80 steps left at 0.5 step/s


def test_planned_jobs_of_a_multirun(tmp_path):
    (tmp_path / "multirun.yaml").write_text("hydra:\n  sweeper:\n    params:\n      a: 1,2,3\n      b: x,y\n")
    assert planned_jobs(tmp_path) == 6
    (tmp_path / "multirun.yaml").write_text("hydra:\n  sweeper:\n    n_trials: 8\n")
    assert planned_jobs(tmp_path) == 8
    (tmp_path / "multirun.yaml").write_text("hydra:\n  sweeper:\n    params:\n      a: range(1,5)\n")
    assert planned_jobs(tmp_path) is None
    (tmp_path / "multirun.yaml").write_text(json.dumps([1, 2]))
    assert planned_jobs(tmp_path) is None
