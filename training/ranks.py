"""Data-parallel training's process group, as the training loop sees it.

The supervisor (supervisor.py) starts one child process per rank and hands each the
variables Lightning's own environment reads (`LOCAL_RANK`, `NODE_RANK`, `WORLD_SIZE`,
`MASTER_ADDR`, `MASTER_PORT`), so Lightning creates no processes of its own: a rank that
dies is the supervisor's to see, and it restarts the whole group from the last checkpoint.

`join` opens the process group before Lightning would, because the loop needs collectives
outside Lightning's fit too: rank 0 alone writes checkpoints, the watchdog's ledger and the
heartbeat, and the other ranks wait at a barrier before they read what it wrote. With one
process every function here is the identity (no group is opened).
"""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

RANK_ENV = ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
PARALLEL = ("ddp", "fsdp")  # the strategies whose ranks the supervisor starts


def rank_env(rank: int, world_size: int, port: int) -> dict[str, str]:
    """The environment of rank `rank` of a one-node group of `world_size` processes."""
    return {"LOCAL_RANK": str(rank), "NODE_RANK": "0", "WORLD_SIZE": str(world_size),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


def configured_world_size(training) -> int:
    """How many processes the training config asks for: `devices` (a count or a list of
    ids) under strategy ddp or fsdp; one otherwise (Lightning's single-device strategies)."""
    if training.get("strategy", "auto") not in PARALLEL:
        return 1
    devices = training.get("devices", 1)
    if isinstance(devices, str) or not isinstance(devices, int) and not hasattr(devices, "__len__"):
        raise ValueError(f"training.devices={devices!r}: strategy {training.get('strategy')} needs a process count "
                         "or a list of device ids")
    return devices if isinstance(devices, int) else len(devices)


def _joined() -> bool:
    return dist.is_available() and dist.is_initialized()


# Once the group is open it is the truth: Lightning's environment deletes WORLD_SIZE from
# os.environ when a fit ends, and a run may fit several times (stages, rollbacks).
def world_size() -> int:
    return dist.get_world_size() if _joined() else int(os.environ.get("WORLD_SIZE", "1"))


def rank() -> int:
    if _joined():
        return dist.get_rank()
    return int(os.environ.get("LOCAL_RANK", "0")) if world_size() > 1 else 0


def is_writer() -> bool:
    """Whether this process writes the run's shared files (checkpoints, ledger, heartbeat)."""
    return rank() == 0


def join(device: torch.device, timeout_s: float) -> None:
    """Open the process group (gloo on the CPU, NCCL on GPUs) once per process. A rank that
    waits in a collective longer than `timeout_s` fails with a retryable error, which is how
    a hung peer is caught."""
    if world_size() > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=rank(), world_size=world_size(),
                                timeout=datetime.timedelta(seconds=timeout_s))


def active() -> bool:
    return _joined() and dist.get_world_size() > 1


def barrier() -> None:
    if active():
        dist.barrier()


def all_sum(x: torch.Tensor) -> torch.Tensor:
    """The sum of `x` over ranks (a copy; x itself on one process)."""
    if not active():
        return x
    x = x.detach().clone().float()
    dist.all_reduce(x)
    return x


def gather_ids(ids: torch.Tensor) -> torch.Tensor:
    """Every rank's sample ids of this micro-batch, in rank order: the ids a single process
    with the whole global batch would have trained on, in its order (sampler.py)."""
    if not active():
        return ids
    parts = [None] * dist.get_world_size()
    dist.all_gather_object(parts, ids.tolist())
    return torch.tensor([i for part in parts for i in part], dtype=ids.dtype)
