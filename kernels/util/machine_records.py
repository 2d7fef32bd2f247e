"""Measurements remembered per machine and software stack, under the speclab cache.

Some choices are made by timing this machine (the machine profile, speculator/target/profile.py;
the training precision), and the timing is worth doing once, not on every run.
A record is keyed by everything that changes the timing: the CPU and its flags, the thread
count, torch's and transformers' versions, the lean kernels' build (their source and
flags), and what the caller adds (the model, the runtime, the lengths). A record is
written atomically; one that cannot be read is measured again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import platform
from pathlib import Path

import torch

from .cache_lock import cache_root, write_atomic

log = logging.getLogger(__name__)


def machine_id() -> str:
    """The CPU model, its feature flags and the thread count."""
    from .. import native

    model, flags = native.cpu_info()
    return f"{model or platform.processor()}|{' '.join(flags)}|threads={torch.get_num_threads()}"


def machine_name() -> str:
    return machine_id().split("|")[0]


def _path(kind: str, parts: list) -> Path:
    from transformers import __version__ as hf_version

    from .. import native

    key = json.dumps([machine_id(), torch.__version__, hf_version, native.build_id(), *parts], default=str)
    return cache_root() / kind / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def read(kind: str, parts: list) -> dict | None:
    """The record stored for these key parts, or None: absent, or unreadable (said in one line)."""
    path = _path(kind, parts)
    try:
        record = json.loads(path.read_text())
    except OSError:
        return None
    except ValueError as exc:
        log.warning("ignoring the unreadable record %s (%s): it is measured again", path.name, exc)
        return None
    return record if isinstance(record, dict) else None


def write(kind: str, parts: list, record: dict) -> None:
    path = _path(kind, parts)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(record, indent=2).encode())


def remember(kind: str, parts: list, record: dict, what: str) -> None:
    """`write`, where a cache that cannot be written (read-only, full) costs a probe per
    process, not the run: logged, and `what` is measured again next time."""
    try:
        write(kind, parts, record)
    except OSError as exc:
        log.warning("could not remember %s (%s): it is measured again next time", what, exc)
