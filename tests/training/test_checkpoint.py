"""Checkpoints: atomic, verified, fallback to the previous one, loud on a full or read-only disk."""

import ctypes
import errno
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from speclab.training import checkpoint as ck
from speclab.training.checkpoint import (MARKER, CheckpointConfig, CheckpointStore, CheckpointWriteError,
                                         complete_steps, step_dir_name)
from speclab.training.faults import corrupt_newest_checkpoint


def states(step: int) -> dict:
    w = torch.arange(1000, dtype=torch.float32) * step
    return {"model": {"w": w}, "optimizer": {"state": {}, "param_groups": []}, "scheduler": {"last_epoch": step},
            "loop": {"step": step}, "rng": {"torch": torch.get_rng_state()}}


def store(tmp_path, **kw) -> CheckpointStore:
    return CheckpointStore(tmp_path / "ckpt", CheckpointConfig(**{"every_n_steps": 1, "keep_last": 10, **kw}))


def test_roundtrip_with_marker_and_checksums(tmp_path):
    s = store(tmp_path)
    path = s.save(3, states(3), config={"seed": 1})
    marker = (path / MARKER).read_text()
    assert '"step": 3' in marker and all(name in marker for name in ck.FILES)
    loaded = s.load_latest()
    assert loaded["step"] == 3 and torch.equal(loaded["model"]["w"], states(3)["model"]["w"])
    assert loaded["config"] == {"seed": 1} and loaded["scheduler"]["last_epoch"] == 3
    assert not list(s.root.glob(".tmp-*"))


def test_damaged_bytes_fall_back_to_the_previous_checkpoint(tmp_path):
    s = store(tmp_path)
    s.save(1, states(1))
    s.save(2, states(2))
    corrupt_newest_checkpoint(s.root)
    loaded = s.load_latest()
    assert loaded["step"] == 1
    assert (s.root / f"corrupt-{step_dir_name(2)}").is_dir() and complete_steps(s.root) == [1]


def test_unmarked_or_temp_directories_are_never_read_and_are_cleaned(tmp_path):
    s = store(tmp_path)
    s.save(1, states(1))
    s.save(2, states(2))
    (s.root / step_dir_name(2) / MARKER).unlink()  # a crash between rename and marker
    (s.root / ".tmp-step-00000003-99").mkdir()
    assert s.load_latest()["step"] == 1
    s.clean_partial()
    assert sorted(p.name for p in s.root.iterdir()) == [step_dir_name(1)]


def test_retention_keeps_the_newest_and_older_anchors(tmp_path):
    s = store(tmp_path, keep_last=2, anchor_every_n_steps=4, keep_anchors=2)
    for step in range(0, 11):
        s.save(step, states(step))
    assert complete_steps(s.root) == [4, 8, 9, 10]  # anchors 4 and 8 (0 aged out), newest 9 and 10
    assert s.load_latest(before=7)["step"] == 4  # a rollback target before a spike at step 7


def test_drop_after_removes_the_abandoned_timeline(tmp_path):
    s = store(tmp_path)
    for step in (0, 2, 4, 6):
        s.save(step, states(step))
    s.drop_after(2)
    assert complete_steps(s.root) == [0, 2]


def test_disk_full_mid_write_fails_loudly_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    s = store(tmp_path)
    s.save(1, states(1))
    real, calls = ck._write_file, []

    def full_disk(path, data):
        calls.append(path.name)
        if len(calls) == 3:  # the third file: half of it lands, then the disk is full
            with open(path, "wb") as f:
                f.write(data[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(path, data)

    monkeypatch.setattr(ck, "_write_file", full_disk)
    with pytest.raises(CheckpointWriteError, match="No space left on device") as info:
        s.save(2, states(2))
    assert info.value.errno == errno.ENOSPC
    monkeypatch.setattr(ck, "_write_file", real)
    assert complete_steps(s.root) == [1] and s.load_latest()["step"] == 1
    assert sorted(p.name for p in s.root.iterdir()) == [step_dir_name(1)]  # no half-written leftovers


def test_disk_full_at_the_completion_marker_leaves_no_unmarked_step(tmp_path, monkeypatch):
    """The marker goes through the shared atomic writer, not the weights' seam: fail it there."""
    s = store(tmp_path)
    s.save(1, states(1))
    real = ck.cache_lock.write_file

    def full_at_marker(path, data, mode=None):
        if MARKER in path.name:  # the marker's private sibling, written before its rename
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(path, data, mode)

    monkeypatch.setattr(ck.cache_lock, "write_file", full_at_marker)
    with pytest.raises(CheckpointWriteError, match="No space left on device"):
        s.save(2, states(2))
    monkeypatch.setattr(ck.cache_lock, "write_file", real)
    assert complete_steps(s.root) == [1] and s.load_latest()["step"] == 1
    assert sorted(p.name for p in s.root.iterdir()) == [step_dir_name(1)]  # the renamed step is gone too


def drop_permission_override() -> None:
    """Root ignores permission bits through CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH: drop both
    from the bounding set before exec, so the writer process honours chmod as any user does."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        if libc.prctl(24, cap, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")


def test_read_only_checkpoint_directory_fails_loudly_and_keeps_the_last_good_checkpoint(tmp_path):
    s = store(tmp_path)
    s.save(1, states(1))
    tmp_path.chmod(0o755)
    for p in [s.root, *s.root.rglob("*")]:
        p.chmod(0o555 if p.is_dir() else 0o444)
    script = textwrap.dedent(f"""
        import torch
        from pathlib import Path
        from speclab.training.checkpoint import CheckpointConfig, CheckpointStore, CheckpointWriteError
        s = CheckpointStore(Path({str(s.root)!r}), CheckpointConfig(every_n_steps=1, keep_last=10))
        try:
            s.save(2, {{"model": {{"w": torch.zeros(3)}}}})
        except CheckpointWriteError as exc:
            print("LOUD", exc)
            raise SystemExit(3)
        print("WROTE")
    """)
    as_root = {"preexec_fn": drop_permission_override} if os.geteuid() == 0 else {}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, **as_root)
    assert proc.returncode == 3 and "LOUD" in proc.stdout and "Permission denied" in proc.stdout, proc.stdout + proc.stderr
    for p in [s.root, *s.root.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    assert complete_steps(s.root) == [1] and s.load_latest()["step"] == 1
