"""A real sweep through Hydra's submitit launcher (`submitit_local`: the SLURM launcher's
local twin: each job is pickled, run in its own process, and its result returned)."""

import json
import os
import subprocess
import sys

from test_sweeps_run import SMALLEST, TINY


def test_quick_sweep_through_submitit_local(tmp_path):
    env = {**os.environ, "SPECLAB_CACHE": str(tmp_path / "cache"), "WANDB_MODE": "disabled"}
    runs = tmp_path / "runs"
    cmd = [sys.executable, "-c", "from speclab.sweeps.cli import main; raise SystemExit(main())", "sweep", "quick",
           "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10", "hydra.launcher.cpus_per_task=1",
           "hydra.sweeper.params.speculator=mlp", f"runs_dir={runs}", *TINY, *SMALLEST]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = [json.loads(p.read_text()) for p in runs.rglob("result.json")]
    (result,) = [r for r in results if r["speculator"]["family"] == "mlp"]  # beside the training-free baselines
    assert result["status"] == "completed" and result["speculator"]["family"] == "mlp"
    assert list((runs / "sweep-quick" / ".submitit").rglob("*_result.pkl")), "the job did not go through submitit"
    assert "mlp" in proc.stdout  # the sweep's runs table
