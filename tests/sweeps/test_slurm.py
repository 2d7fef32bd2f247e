"""SLURM through submitit: the launcher config renders the sbatch options a cluster run needs,
and a job of two tasks runs through submitit's local executor (the SLURM launcher's local
twin): each task builds a shard of the data, task 0 trains, and a preemption mid-training
requeues the job, which resumes the same run directory from its newest complete checkpoint."""

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import submitit
import submitit.slurm.slurm
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from test_sweeps_run import SMALLEST, TINY


def launcher_config(*overrides):
    with initialize_config_module("speclab.configs", version_base=None):
        cfg = compose("config", overrides=["hydra/launcher=slurm", *overrides], return_hydra_config=True)
    return OmegaConf.to_container(cfg.hydra.launcher, resolve=False)


def test_the_slurm_launcher_asks_for_nodes_tasks_gpus_a_time_limit_and_requeue(tmp_path, monkeypatch):
    monkeypatch.setattr(submitit.slurm.slurm.SlurmExecutor, "affinity", staticmethod(lambda: 1))  # no srun here
    params = launcher_config("hydra.launcher.nodes=2", "hydra.launcher.tasks_per_node=4",
                             "hydra.launcher.timeout_min=90", "hydra.launcher.partition=gpu")
    # As the plugin hands them to submitit (hydra_submitit_launcher's launch): base keys as they
    # are, SLURM-specific ones prefixed; the folder and max_num_timeout go to the executor.
    base = {"timeout_min", "cpus_per_task", "gpus_per_node", "tasks_per_node", "mem_gb", "nodes", "name",
            "stderr_to_stdout"}
    executor = submitit.AutoExecutor(folder=tmp_path, cluster="slurm", slurm_max_num_timeout=params["max_num_timeout"])
    executor.update_parameters(**{k if k in base else f"slurm_{k}": v for k, v in params.items()
                                  if k not in ("submitit_folder", "max_num_timeout", "_target_") and v is not None
                                  and k != "name"})
    sbatch = executor._executor._make_submission_file_text("true", "uid")
    for line in ("--nodes=2", "--ntasks-per-node=4", "--gpus-per-node=8", "--time=90", "--requeue",
                 "--signal=USR2@120", "--partition=gpu", "--cpus-per-task=16"):
        assert f"#SBATCH {line}" in sbatch, line
    assert params["max_num_timeout"] == 3  # time limits requeue too, three times


def _task_zero(sweep: subprocess.Popen) -> psutil.Process | None:
    """The job's task 0: submitit's job process whose global rank is 0."""
    for proc in psutil.Process(sweep.pid).children(recursive=True):
        try:
            if "submitit.core._submit" in " ".join(proc.cmdline()) and \
                    proc.environ().get("SUBMITIT_LOCAL_GLOBALID") == "0":
                return proc
        except psutil.Error:
            continue
    return None


def test_a_two_task_job_shards_the_data_and_a_preempted_job_resumes_its_run(tmp_path):
    env = {**os.environ, "SPECLAB_CACHE": str(tmp_path / "cache"), "WANDB_MODE": "disabled"}
    runs = tmp_path / "runs"
    cmd = [sys.executable, "-c", "from speclab.sweeps.cli import main; raise SystemExit(main())", "train", "-m",
           "hydra/launcher=submitit_local", "hydra.launcher.tasks_per_node=2", "hydra.launcher.timeout_min=15",
           "++data.shards=2", "speculator=mlp", f"runs_dir={runs}", "hydra.sweep.dir=" + str(runs / "sweep"),
           *TINY, *SMALLEST, "training.max_steps=12",
           # Training stops making progress at step 8 (a checkpoint at 5 is complete), so the
           # preemption lands mid-training however slow the job's checkpoint-and-requeue is.
           "faults=hang", "faults.at_step=8"]
    sweep = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    heartbeat, preempted = None, False
    deadline = time.time() + 600
    while sweep.poll() is None and time.time() < deadline and not preempted:
        beats = list(runs.rglob("heartbeat.json"))
        if beats:
            heartbeat = json.loads(beats[0].read_text() or "{}")
        if heartbeat and heartbeat.get("phase") == "training" and heartbeat.get("step", 0) >= 7:
            task = _task_zero(sweep)
            if task is not None:
                task.send_signal(signal.SIGUSR2)  # what SLURM sends before preempting a job
                preempted = True
        time.sleep(0.05)
    out, _ = sweep.communicate(timeout=max(1, deadline - time.time()))
    assert sweep.returncode == 0, out[-4000:]
    assert preempted, "training ended before the test could preempt it"
    (result_file,) = runs.rglob("result.json")  # one run directory: the requeued job reused it
    result = json.loads(result_file.read_text())
    assert result["status"] == "completed" and result["train"]["steps"] == 12
    supervisor = json.loads((result_file.parent / "supervisor.json").read_text())
    (attempt,) = supervisor["attempts"]  # the requeued job's supervisor: one attempt, resumed at step 5
    assert attempt["newest_checkpoint_before"] == 5 and attempt["resumed_from"] == 5
    logs = "".join(p.read_text(errors="replace") for p in (runs / "sweep" / ".submitit").rglob("*.out"))
    logs += "".join(p.read_text(errors="replace") for p in (runs / "sweep" / ".submitit").rglob("*.err"))
    assert "Requeued job" in logs
    assert "task 1 of 2 built its shard" in logs
    (bundle,) = [p for p in (tmp_path / "cache" / "data").iterdir() if p.is_dir() and not p.name.startswith(".")
                 and not p.name.endswith(".shards")]
    assert json.loads((bundle / "meta.json").read_text())["growth"]["rounds"] == 1
