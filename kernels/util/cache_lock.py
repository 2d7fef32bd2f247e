"""One writer at a time per shared cache entry, and room on disk before a cache is filled.

Sweep runs (joblib workers on one machine, SLURM jobs on a shared filesystem) build the
same data and feature caches at once. Each writer builds in its own temporary folder and
publishes with one rename; `build_lock` makes the second writer wait for the first and then
reuse its cache instead of building a twin. The lock is a POSIX record lock (`lockf`) on a
sibling `.NAME.lock` file: the kernel drops it when its process dies, so a crashed writer
never leaves a stale lock, and NFS forwards POSIX locks to the server, so it also holds
across nodes. The lock file itself stays (removing it would let two writers lock two files).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import shutil
import uuid
from pathlib import Path
from typing import Iterator

log = logging.getLogger(__name__)


def cache_root() -> Path:
    """Where speclab's shared caches live: $SPECLAB_CACHE, default ~/.cache/speclab."""
    return Path(os.environ.get("SPECLAB_CACHE", Path.home() / ".cache" / "speclab"))


class CacheSpaceError(OSError):
    """Not enough free space for a cache file: the message names the path and the bytes needed."""


@contextlib.contextmanager
def build_lock(final: Path) -> Iterator[None]:
    """Hold the build lock of cache entry `final` (waiting for another writer if it holds it)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.parent / f".{final.name}.lock", "a+") as handle:
        try:
            fcntl.lockf(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another process that is building %s", final)
            fcntl.lockf(handle, fcntl.LOCK_EX)
        except OSError as exc:  # a filesystem without locks: the atomic publish alone still holds
            if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                raise
            log.warning("no file locks on %s (%s): concurrent runs may build it twice", final.parent, exc)
        yield  # the lock goes with the file's close


def work_dir_for(final: Path) -> Path:
    """A private temporary folder beside `final` (same filesystem, so the publishing rename is atomic)."""
    work = final.parent / f".{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    work.mkdir(parents=True)
    return work


def publish_dir(work: Path, final: Path) -> bool:
    """Rename the finished `work` into place; False (and `work` dropped) if `final` already exists,
    which only a writer on a lock-less filesystem can have published meanwhile."""
    try:
        os.replace(work, final)
        return True
    except OSError:  # final is a non-empty directory
        shutil.rmtree(work, ignore_errors=True)
        return False


def write_file(path: Path, data: bytes, mode: int | None = None) -> None:
    """Write and fsync one file, `mode` applied before the first byte."""
    with open(path, "wb") as f:
        if mode is not None:
            os.fchmod(f.fileno(), mode)
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def fsync_dir(directory: Path) -> None:
    """Make a rename in `directory` durable (a no-op where a directory cannot be opened or synced)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: str | Path, data: bytes, mode: int | None = None) -> Path:
    """Replace `path` with `data` so that a reader sees the old file or the new one, never a
    mix, and a crash leaves no partial file: a private sibling, fsynced, renamed into place."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
    try:
        write_file(tmp, data, mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return path


def ensure_free_space(path: Path, needed: int) -> None:
    """Refuse to fill a cache file that the filesystem cannot hold.

    A memory-mapped file is created sparse, and a write into a page the disk cannot back
    kills the process with SIGBUS, with no message. Checking first gives a one-line error;
    `reserve` then claims the blocks so a disk filled meanwhile fails here too, not later.
    """
    free = shutil.disk_usage(path.parent).free
    if free < needed:
        raise CacheSpaceError(errno.ENOSPC, f"not enough space for {path}: {needed:,} bytes needed, "
                              f"{free:,} free (set SPECLAB_CACHE to a larger filesystem)")


def reserve(path: Path, size: int) -> None:
    """Allocate `size` bytes of `path` on disk now (ENOSPC here instead of SIGBUS at a write)."""
    fd = os.open(path, os.O_RDWR)
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise CacheSpaceError(exc.errno, f"not enough space for {path}: {size:,} bytes needed "
                                  "(set SPECLAB_CACHE to a larger filesystem)") from exc
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
    finally:
        os.close(fd)
