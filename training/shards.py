"""A cache build split across processes: each shard its own cache entry, merged by one.

The expensive loop of a build (a round's answers, the feature pass) runs over batches of a
length-sorted order. With `n` shards, shard k takes batches k, k+n, k+2n, ... of that very
order, so each batch holds the rows it holds in a one-process build and the merged result
is bitwise the one-process result, whatever the runtime's batch invariance.

Each shard is published as its own entry (`<entry>/shard-<k>-of-<n>/`: built in a private
folder, renamed into place with its COMPLETE marker inside), under its own build lock. A
process builds its own shard first, then every shard still missing: one that another
process is building it waits for (the lock), one whose builder died it builds itself. So
any number of processes, one to n, finish a build, and a rerun after a crash rebuilds only
the shards that were not published.

Which shard a process builds: `data.shard` where set; else its SLURM array task
(`SLURM_ARRAY_TASK_ID` - `SLURM_ARRAY_TASK_MIN`); else its task in a job of several tasks
(`SLURM_PROCID` of `SLURM_NTASKS`, or submitit's local twins: sweeps/job_tasks.py); else its
torch.distributed `RANK`; else none of its own (one process builds every shard in turn).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from speclab.kernels.util.cache_lock import build_lock, publish_dir, work_dir_for

COMPLETE = "COMPLETE"


@dataclass(frozen=True)
class ShardPlan:
    count: int = 1  # shards a build is split into
    index: int | None = None  # this process's own shard; None: it has none and builds all in turn

    def order(self) -> list[int]:
        """The shards this process builds or waits for: its own first, then the ones after it."""
        first = self.index or 0
        return [(first + j) % self.count for j in range(self.count)]


def shard_plan(shards: int, shard: int | None = None, env: dict | None = None) -> ShardPlan:
    """This process's place in a build of `shards` shards (module docstring). An inconsistent
    setup fails with one line naming the keys to change."""
    env = os.environ if env is None else env
    if shards < 1:
        raise ValueError(f"data.shards={shards}: a build has at least one shard")
    if shard is None and "SLURM_ARRAY_TASK_ID" in env and shards > 1:
        shard = int(env["SLURM_ARRAY_TASK_ID"]) - int(env.get("SLURM_ARRAY_TASK_MIN", 0))
        tasks = int(env.get("SLURM_ARRAY_TASK_COUNT", shards))
        if tasks != shards:
            raise ValueError(f"data.shards={shards} but the SLURM array has {tasks} tasks: "
                             f"submit --array=0-{shards - 1} or set data.shards={tasks}")
    elif shard is None and int(env.get(_TASKS[0], env.get(_TASKS[1], 1))) > 1:
        tasks, task = _job_task(env)
        if tasks != shards:
            raise ValueError(f"data.shards={shards} but this job runs {tasks} tasks, one shard each: "
                             f"set data.shards={tasks}")
        shard = task
    elif shard is None and "RANK" in env and shards > 1:
        shard, world = int(env["RANK"]), int(env.get("WORLD_SIZE", shards))
        if world != shards:
            raise ValueError(f"data.shards={shards} but this process is rank {shard} of {world}: "
                             f"set data.shards={world}")
    if shard is not None and not 0 <= shard < shards:
        raise ValueError(f"data.shard={shard} is outside data.shards={shards} (shards are 0..{shards - 1})")
    return ShardPlan(shards, shard if shards > 1 else None)


# A job's tasks: submitit's local executor, then SLURM (the variables srun gives each task).
_TASKS, _TASK = ("SUBMITIT_LOCAL_NTASKS", "SLURM_NTASKS"), ("SUBMITIT_LOCAL_GLOBALID", "SLURM_PROCID")


def _job_task(env) -> tuple[int, int]:
    """(tasks, this task's rank) of the job this process is a task of."""
    local = _TASKS[0] in env
    return int(env[_TASKS[0 if local else 1]]), int(env.get(_TASK[0 if local else 1], 0))


def batches_of(order: Sequence[int], batch_size: int, k: int, n: int) -> list[int]:
    """The items of batches k, k+n, k+2n, ... when `order` is cut into `batch_size`-long
    batches, in `order`'s order. Only the last batch of `order` can be short, and it is the
    last of its shard's too, so cutting the result into batches gives those same batches."""
    return [i for start in range(k * batch_size, len(order), n * batch_size) for i in order[start:start + batch_size]]


def shard_dir(entry: Path, k: int, n: int) -> Path:
    return entry / f"shard-{k}-of-{n}"


def complete(path: Path) -> bool:
    return (path / COMPLETE).is_file()


def build_shards(entry: Path, plan: ShardPlan, build: Callable[[int, Path], None],
                 merged: Callable[[], bool] = lambda: False) -> list[Path]:
    """Every shard of `entry` published (module docstring); their folders in shard order.
    `build(k, folder)` writes shard k's files into `folder`; `merged()` says the shards were
    already merged by another process (nothing left to build)."""
    for k in plan.order():
        path = shard_dir(entry, k, plan.count)
        if complete(path):
            continue
        with build_lock(path):
            if complete(path) or merged():
                continue
            shutil.rmtree(path, ignore_errors=True)  # a half-built shard of a dead process
            work = work_dir_for(path)
            try:
                build(k, work)
                (work / COMPLETE).write_text("")  # inside the folder the rename publishes
                publish_dir(work, path)
            finally:
                shutil.rmtree(work, ignore_errors=True)
    return [shard_dir(entry, k, plan.count) for k in range(plan.count)]


def drop_shards(entry: Path) -> None:
    """The shards' entry once merged: the merged cache is the truth, and holds the same rows."""
    shutil.rmtree(entry, ignore_errors=True)
