"""The whole platform on the tiny target: a two-run multirun through train -> eval -> export."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from speclab.sweeps.export_formats import load_checkpoint

TINY = ["target=tiny", "training=smoke", "eval=smoke", "data.num_prompts=12", "data.max_response_tokens=24",
        "data.max_prompt_tokens=96", "data.prompt_sampling_budget=8", "data.heldout_size=2", "data.gen_batch_size=6", "threads=1"]


def speclab(*args, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-c", "from speclab.sweeps.cli import main; raise SystemExit(main())", *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def multirun(tmp_path_factory):
    root = tmp_path_factory.mktemp("e2e")
    env = {**os.environ, "SPECLAB_CACHE": str(root / "cache"), "WANDB_MODE": "disabled"}
    runs = root / "runs"
    proc = speclab("train", "-m", "speculator=mlp,draft_lm", f"runs_dir={runs}", *TINY, cwd=root, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return root, runs, env


def test_multirun_writes_a_completed_result_per_family(multirun):
    _, runs, _ = multirun
    results = [json.loads(p.read_text()) for p in sorted(runs.rglob("result.json"))]
    assert sorted(r["speculator"]["family"] for r in results) == ["draft_lm", "mlp"]
    for r in results:
        assert r["status"] == "completed", r["error"]
        assert r["lossless"]["mismatches"] == 0 and r["lossless"]["checked_prompts"] == 3
        acc = r["acceptance"]
        assert acc["num_draft_tokens"] == acc["num_drafts"] * acc["k"] > 0
        assert acc["mean_acceptance_length"] == pytest.approx(1 + acc["num_accepted_tokens"] / acc["num_drafts"])
        assert r["throughput"]["speedup"] == pytest.approx(r["throughput"]["spec_tok_s"] / r["throughput"]["baseline_tok_s"])
        assert r["train"]["steps"] == 12 and r["train"]["final_loss"] > 0
        assert r["config"]["speculator"]["family"] == r["speculator"]["family"]
        assert len(r["final_weights_sha256"]) == 64


def test_second_run_reuses_data_and_feature_caches(multirun):
    root, _, _ = multirun
    features = [p for p in (root / "cache" / "features").iterdir() if not p.name.endswith(".lock")]  # build locks stay
    assert len(features) == 1, "both runs of the sweep must share one feature cache"


def test_runs_table_and_export_reload(multirun):
    root, runs, env = multirun
    table = speclab("runs", "--runs", str(runs), cwd=root, env=env)
    assert table.returncode == 0, table.stderr
    assert "mlp" in table.stdout and "draft_lm" in table.stdout
    out = root / "best"
    exported = speclab("export", "--best", "--metric", "speedup", "--runs", str(runs), "--out", str(out), cwd=root, env=env)
    assert exported.returncode == 0, exported.stderr
    best = max((json.loads(p.read_text()) for p in runs.rglob("result.json")), key=lambda r: r["throughput"]["speedup"])
    assert load_checkpoint(out).family == best["speculator"]["family"]


def test_unknown_family_names_the_valid_choices(tmp_path):
    proc = speclab("train", "speculator=nope", "target=tiny", f"runs_dir={tmp_path}", cwd=tmp_path, env=dict(os.environ))
    assert proc.returncode != 0
    assert "draft_lm" in proc.stderr + proc.stdout and "mlp" in proc.stderr + proc.stdout
