"""The hardware-fault supervisor: each training attempt in a child process, restarted when it may help.

A device error can leave a process unusable (a CUDA context after an illegal address
stays broken), so the parent never trains: it starts each attempt as a child, watches
its heartbeat, classifies how it ended, and restarts retryable failures from the last
complete checkpoint (the child resumes by itself: `fit` always starts from the newest
checkpoint that verifies).

Children come from a 'forkserver' that has already imported the attempt's module:
starting one costs a fork, not a fresh interpreter importing torch, and the child
inherits no CUDA state and no threads from the parent. The attempt function and its
arguments must be picklable (a module-level function and plain data, e.g. the run's
resolved config as a dict): the child rebuilds its inputs from them, which the
data and feature caches make cheap the second time.

Classification of an attempt's end:
- completed: the child reported a result;
- retryable: a device error (`torch.AcceleratorError`, an injected `SimulatedDeviceError`),
  a collective timeout (`torch.distributed.DistBackendError`), death by a signal, an
  exit without a report, a hang (no heartbeat for `heartbeat_timeout_s`);
- fatal: any other exception (config, shape, a checkpoint that cannot be written, an
  exhausted rollback budget): a retry would fail the same way.
Retryable failures restart after an exponential backoff, until `max_restarts` restarts
were used or `max_restarts_without_progress` restarts in a row did not advance the
newest complete checkpoint. Every attempt is recorded in the run's `supervisor.json`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing as mp
import os
import signal
import socket
import sys
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Literal

import torch

from . import ranks
from .checkpoint import CheckpointWriteError, complete_steps, write_json_atomic
from .faults import SimulatedDeviceError, fired
from .watchdog import WATCHDOG_FILE

log = logging.getLogger(__name__)

HEARTBEAT_FILE = "heartbeat.json"
SUPERVISOR_FILE = "supervisor.json"
ATTEMPT_FILE = "attempt-{}.json"
RANK_ATTEMPT_FILE = "attempt-{}-rank-{}.json"  # ranks other than 0 of a data-parallel attempt
CHECKPOINTS = "checkpoints"
EXIT_RETRYABLE, EXIT_FATAL = 75, 76


@dataclass
class SupervisorConfig:
    """Restart policy of a run's training attempts (training config block `supervisor`)."""

    max_restarts: int = 3
    """Restarts after retryable failures; one more failure fails the run."""
    max_restarts_without_progress: int = 2
    """Consecutive restarts that did not advance the newest checkpoint before the run fails."""
    backoff_s: float = 2.0
    """Wait before the first restart; doubled for each further one."""
    backoff_max_s: float = 60.0
    """Longest wait between attempts."""
    heartbeat_timeout_s: float = 300.0
    """A child whose heartbeat is older than this (once training has begun) is killed as hung."""
    startup_timeout_s: float = 900.0
    """Time allowed from a child's start to its first training step (loading, features)."""
    poll_s: float = 0.2
    """How often the parent looks at the child."""
    collective_timeout_s: float = 120.0
    """Data-parallel runs: a rank waiting this long in a collective (a peer hung or died)
    fails the attempt, which is retried."""


@dataclass
class Outcome:
    status: Literal["completed", "failed"]
    reason: str | None
    train: dict
    attempts: list[dict] = field(default_factory=list)

    def raise_if_failed(self) -> None:
        if self.status == "failed":
            raise TrainingFailed(self.reason)


class TrainingFailed(RuntimeError):
    """The supervised training gave up; the message is the reason."""


# --- the child's side -------------------------------------------------------------------------


class Heartbeat:
    """The child's pulse: `run_dir/heartbeat.json`, rewritten after every optimiser step.

    It also carries where this attempt resumed and when it completed its first step
    there, which the parent turns into "time from fault to resumed training".
    """

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / HEARTBEAT_FILE
        self.resumed_from: int | None = None
        self.first_step_time: float | None = None

    def __call__(self, step: int, phase: Literal["setup", "training"] = "training") -> None:
        now = time.time()
        if phase == "training" and self.resumed_from is None:
            self.resumed_from = step
        elif phase == "training" and self.first_step_time is None and step > self.resumed_from:
            self.first_step_time = now
        write_json_atomic(self.path, {"step": step, "phase": phase, "time": now, "pid": os.getpid(),
                                      "resumed_from": self.resumed_from, "first_step_time": self.first_step_time})


def is_retryable(exc: BaseException) -> bool:
    retryable = (SimulatedDeviceError, getattr(torch, "AcceleratorError", SimulatedDeviceError))
    if torch.distributed.is_available():
        retryable += (torch.distributed.DistBackendError,)
    return isinstance(exc, retryable) and not isinstance(exc, CheckpointWriteError)


def _exit_with(parent_pid: int) -> None:
    """A forkserver child outlives its supervisor unless it checks: an orphan attempt would
    go on writing checkpoints that a new supervisor of the same run also writes."""
    def watch():
        while True:
            time.sleep(1.0)
            try:
                os.kill(parent_pid, 0)
            except ProcessLookupError:
                os._exit(EXIT_RETRYABLE)

    threading.Thread(target=watch, daemon=True, name="exit-with-supervisor").start()


def _child_main(attempt: Callable[..., dict], args: tuple, run_dir: str, number: int, parent_pid: int,
                env: dict[str, str]) -> None:
    _exit_with(parent_pid)
    os.environ.update(env)  # this rank's place in a data-parallel group (ranks.py); empty for one process
    if ranks.is_writer():
        Heartbeat(Path(run_dir))(-1, "setup")
    report = Path(run_dir) / _report_name(number, ranks.rank())
    try:
        train = attempt(*args)
    except BaseException as exc:  # report, then leave without running the interpreter's teardown
        traceback.print_exc()
        retryable = is_retryable(exc)
        write_json_atomic(report, {"status": "error", "retryable": retryable, "error": _one_line(exc)})
        os._exit(EXIT_RETRYABLE if retryable else EXIT_FATAL)
    write_json_atomic(report, {"status": "completed", "train": train})


def _report_name(number: int, rank: int) -> str:
    return ATTEMPT_FILE.format(number) if rank == 0 else RANK_ATTEMPT_FILE.format(number, rank)


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:500]


# --- the parent's side ------------------------------------------------------------------------


def _context(module: str) -> mp.context.BaseContext:
    """The forkserver context, its server preloading torch, Lightning and the attempt's module."""
    if module == "__main__":  # `python -m pkg.mod`: preload it by its real name (the server cannot import "__main__")
        spec = getattr(sys.modules["__main__"], "__spec__", None)
        module = spec.name if spec is not None else "speclab.training.train"
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["speclab.training.train", module])  # takes effect when the server first starts
    return ctx


@contextlib.contextmanager
def _own_start_method(ctx: mp.context.BaseContext):
    """Start children with `ctx`'s method also in what they inherit.

    A child's preparation data carries the process-wide start method, which the child sets
    before anything else. Under joblib's launcher that method is 'loky', a context only
    joblib's workers know, so every child died with "cannot find context for 'loky'". The
    supervisor's own method is set for the start and the caller's put back afterwards.
    """
    previous = mp.get_start_method(allow_none=True)
    mp.set_start_method(ctx.get_start_method(), force=True)
    try:
        yield
    finally:
        mp.set_start_method(previous, force=True)


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def run_attempt(attempt: Callable[..., dict], args: tuple, run_dir: Path, number: int, cfg: SupervisorConfig,
                world_size: int = 1) -> dict:
    """Start one child per rank and watch them to their end; returns the attempt's record.
    A data-parallel group lives and dies together (`_group_cause`)."""
    (run_dir / HEARTBEAT_FILE).unlink(missing_ok=True)
    record = {"attempt": number, "start_time": time.time(), "resumed_from": None, "first_step_time": None,
              "last_step": None, "newest_checkpoint_before": _newest(run_dir), "world_size": world_size}
    ctx = _context(attempt.__module__)
    port = _free_port() if world_size > 1 else 0
    procs = [ctx.Process(target=_child_main, args=(attempt, args, str(run_dir), number, os.getpid(),
                                                   ranks.rank_env(r, world_size, port) if world_size > 1 else {}))
             for r in range(world_size)]
    with _own_start_method(ctx):
        for proc in procs:
            proc.start()
    started, hung, survivors = time.time(), None, []
    try:
        while any(p.is_alive() for p in procs) and not hung and not any(p.exitcode for p in procs):
            procs[0].join(cfg.poll_s)
            hb = _heartbeat(run_dir, record)
            alive_at = hb["time"] if hb is not None and hb["phase"] == "training" else None
            if alive_at is None and time.time() - started > cfg.startup_timeout_s:
                hung = f"hang: no training step within startup_timeout_s={cfg.startup_timeout_s}s"
            elif alive_at is not None and time.time() - alive_at > cfg.heartbeat_timeout_s:
                hung = f"hang: no heartbeat for {time.time() - alive_at:.1f}s (heartbeat_timeout_s={cfg.heartbeat_timeout_s})"
        if not hung and len(procs) > 1:
            survivors = _await_peers(procs, cfg.collective_timeout_s)
    finally:  # a hang, a failed rank, or the supervisor itself interrupted: no child outlives this
        for proc in procs:
            if proc.is_alive():
                proc.kill()
        for proc in procs:
            proc.join()
    _heartbeat(run_dir, record)
    record.update(end_time=time.time(), newest_checkpoint_after=_newest(run_dir))
    reports = [_read_json(run_dir / _report_name(number, r)) for r in range(len(procs))]
    if len(procs) == 1:
        record.update(exitcode=procs[0].exitcode, **_classify(procs[0].exitcode, reports[0], hung))
    else:
        record.update(_group_cause([p.exitcode for p in procs], reports, hung, survivors, cfg.collective_timeout_s))
    return record


def _await_peers(procs: list, grace_s: float) -> list[int]:
    """Once a rank has failed, give the others `grace_s` (the collective timeout: a live peer
    fails its next collective by then) to end by themselves; the ranks still running after
    it are returned (they hang), and killed by the caller."""
    deadline = time.time() + grace_s
    for proc in procs:
        proc.join(max(0.0, deadline - time.time()))
    return [r for r, p in enumerate(procs) if p.is_alive()]


def _group_cause(exitcodes: list[int | None], reports: list[dict | None], hung: str | None,
                 survivors: list[int], grace_s: float) -> dict:
    """A data-parallel attempt's outcome, with the reason of the rank that caused its end.

    When one rank dies, its peers' collectives fail next ("connection closed by peer", a
    timeout), so those errors are consequences: the cause is a rank that died by a signal
    or reported a retryable error, else one still running after the others had failed (a
    hang), else the first rank that reported a fatal error (every rank failing alike: a
    retry would fail the same way)."""
    if hung:
        return {"status": "retryable", "reason": hung, "exitcode": exitcodes[0]}
    if all(code == 0 for code in exitcodes):
        return {"exitcode": 0, **_classify(0, reports[0], None)}
    outcomes = {r: _classify(code, reports[r], None) for r, code in enumerate(exitcodes)
                if code != 0 and r not in survivors}
    retryable = [r for r, o in outcomes.items() if o["status"] == "retryable"]
    if retryable:
        cause, outcome = retryable[0], outcomes[retryable[0]]
    elif survivors:
        cause = survivors[0]
        outcome = {"status": "retryable", "reason": f"hang: still running {grace_s:.0f}s after another rank failed"}
    else:
        cause = min(outcomes)
        outcome = outcomes[cause]
    return {**outcome, "reason": f"rank {cause}: {outcome['reason']}", "exitcode": exitcodes[cause]}


def _free_port() -> int:
    """A TCP port on the loopback that is free now, for the group's rendezvous."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _heartbeat(run_dir: Path, record: dict) -> dict | None:
    hb = _read_json(run_dir / HEARTBEAT_FILE)
    if hb is not None and hb["phase"] == "training":
        record.update(resumed_from=hb["resumed_from"], first_step_time=hb["first_step_time"], last_step=hb["step"])
    return hb


def _newest(run_dir: Path) -> int | None:
    steps = complete_steps(run_dir / CHECKPOINTS)
    return steps[-1] if steps else None


def _classify(exitcode: int | None, report: dict | None, hung: str | None) -> dict:
    if hung:
        return {"status": "retryable", "reason": hung}
    if report is not None and report["status"] == "completed" and exitcode == 0:
        return {"status": "completed", "reason": None, "train": report["train"]}
    if report is not None and report["status"] == "error":
        return {"status": "retryable" if report["retryable"] else "fatal", "reason": report["error"]}
    if exitcode is not None and exitcode < 0:
        return {"status": "retryable", "reason": f"killed by signal {signal.Signals(-exitcode).name}"}
    return {"status": "retryable", "reason": f"exited with code {exitcode} without a report"}


def supervise(attempt: Callable[..., dict], args: tuple, run_dir: Path, cfg: SupervisorConfig,
              world_size: int = 1) -> Outcome:
    """Run `attempt(*args)` in child processes (`world_size` ranks of a data-parallel group at
    a time) until it completes or the policy gives up."""
    run_dir = Path(run_dir)
    attempts: list[dict] = []
    start, stalled = time.time(), 0
    while True:
        record = run_attempt(attempt, args, run_dir, len(attempts), cfg, world_size)
        _fault_times(record, run_dir, attempts)
        attempts.append(record)
        write_json_atomic(run_dir / SUPERVISOR_FILE, {"config": asdict(cfg), "attempts": attempts})
        restarts = len(attempts) - 1
        if record["status"] == "completed":
            return Outcome("completed", None, _train_block(record["train"], attempts, start), attempts)
        log.warning("training attempt %d failed (%s): %s", record["attempt"], record["status"], record["reason"])
        before, after = record["newest_checkpoint_before"], record["newest_checkpoint_after"]
        stalled = stalled + 1 if restarts > 0 and (after is None or (before is not None and after <= before)) else 0
        reason = None
        if record["status"] == "fatal":
            reason = record["reason"]
        elif restarts >= cfg.max_restarts:
            reason = f"gave up after {restarts} restarts (max_restarts={cfg.max_restarts}); last failure: {record['reason']}"
        elif stalled >= cfg.max_restarts_without_progress:
            reason = (f"gave up: {stalled} restarts in a row made no progress past checkpoint step {after}; "
                      f"last failure: {record['reason']}")
        if reason:
            return Outcome("failed", reason, _train_block(None, attempts, start, run_dir), attempts)
        time.sleep(min(cfg.backoff_max_s, cfg.backoff_s * 2 ** restarts))


def _fault_times(record: dict, run_dir: Path, attempts: list[dict]) -> None:
    """Fill the previous failed attempt's recovery figures now that this one has run."""
    if not attempts:
        return
    prev = attempts[-1]
    faults = [f for f in fired(run_dir) if prev["start_time"] <= f["time"] <= prev["end_time"]]
    prev["fault_time"] = faults[-1]["time"] if faults else prev["end_time"]
    if record["first_step_time"] is not None:
        prev["fault_to_resumed_s"] = record["first_step_time"] - prev["fault_time"]
    if prev["last_step"] is not None and record["resumed_from"] is not None:
        prev["steps_recomputed"] = max(0, prev["last_step"] - record["resumed_from"])


def _train_block(train: dict | None, attempts: list[dict], start: float, run_dir: Path | None = None) -> dict:
    """The child's `train` block plus the supervisor's figures (a failed run: what is known)."""
    block = dict(train or {"steps": attempts[-1]["last_step"] or 0, "tokens": 0, "final_loss": None,
                           "rollbacks": _ledger_rollbacks(run_dir), "faults": fired(run_dir) if run_dir else []})
    block.update(restarts=len(attempts) - 1, wall_s=time.time() - start,
                 attempts=[{k: a.get(k) for k in ("attempt", "status", "reason", "exitcode", "resumed_from", "last_step",
                                                  "fault_to_resumed_s", "steps_recomputed")} for a in attempts])
    return block


def _ledger_rollbacks(run_dir: Path | None) -> int:
    ledger = _read_json(run_dir / WATCHDOG_FILE) if run_dir else None
    return len(ledger["rollbacks"]) if ledger else 0
