"""The tasks of one job of several (SLURM's `--ntasks`, submitit's local twin) share a run.

submitit runs a job's function once per task. Every task builds one shard of the run's data
and feature pass (`data.shards` = the job's tasks; training/shards.py finds each task's
shard), then task 0 alone trains, evaluates and writes the run, its supervisor starting
`training.devices` ranks on its node; the other tasks return once their shard is in the
shared caches. A requeued job (preemption, or a time limit with `max_num_timeout` left)
reruns every task in the same run directory: the caches are found complete and training
resumes from the newest complete checkpoint.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from omegaconf import DictConfig, open_dict

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobTask:
    rank: int = 0  # global rank of this task in its job
    tasks: int = 1
    local_rank: int = 0  # on its node: which GPU its share of the build uses


def job_task() -> JobTask:
    """This process's task in a submitit job; one task of one outside a job."""
    import submitit

    try:
        env = submitit.JobEnvironment()
    except RuntimeError:  # not inside a submitit job
        return JobTask()
    return JobTask(env.global_rank, env.num_tasks, env.local_rank)


def build_share(cfg: DictConfig, task: JobTask) -> None:
    """A task other than 0: its shard of the run's data and features, on its own GPU."""
    from .experiment import prepare  # torch, transformers: only where there is work

    if str(cfg.target.get("device", "cpu")) == "cuda":
        with open_dict(cfg):
            cfg.target.device = f"cuda:{task.local_rank}"
    prepare(cfg)
    log.info("task %d of %d built its shard of the data and features; task 0 trains", task.rank, task.tasks)
