"""The supervisor: how an attempt's end is classified, and when it stops restarting."""

import json

import pytest

from speclab.training.checkpoint import CheckpointWriteError
from speclab.training.fault_matrix import run_tiny, tiny_config
from speclab.training.faults import SimulatedDeviceError
from speclab.training.supervisor import SUPERVISOR_FILE, _classify, is_retryable
from speclab.training.watchdog import RollbackBudgetExhausted

FAST = ["training.max_steps=8", "training.checkpoint_every_n_steps=3"]


def test_classification():
    assert _classify(0, {"status": "completed", "train": {}}, None)["status"] == "completed"
    assert _classify(None, None, "hang: no heartbeat")["status"] == "retryable"
    assert _classify(-9, None, None) == {"status": "retryable", "reason": "killed by signal SIGKILL"}
    assert _classify(75, {"status": "error", "retryable": True, "error": "x"}, None)["status"] == "retryable"
    assert _classify(76, {"status": "error", "retryable": False, "error": "ValueError: bad"}, None) == \
        {"status": "fatal", "reason": "ValueError: bad"}
    assert _classify(1, None, None)["status"] == "retryable"  # died before it could report


def test_retryable_exceptions():
    assert is_retryable(SimulatedDeviceError("x"))
    assert not is_retryable(ValueError("shape mismatch"))
    assert not is_retryable(RollbackBudgetExhausted("budget"))
    assert not is_retryable(CheckpointWriteError(28, "disk full"))


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("supervisor")


def test_a_permanent_fault_stops_after_exactly_max_restarts(root):
    cfg = tiny_config(*FAST, "faults=exception", "faults.at_step=5", "faults.repeat=every_attempt",
                      "training.supervisor.max_restarts=2", "training.supervisor.max_restarts_without_progress=10")
    out = run_tiny(cfg, root / "permanent", root / "cache")
    assert out.status == "failed" and "max_restarts=2" in out.reason and "SimulatedDeviceError" in out.reason
    assert out.train["restarts"] == 2 and len(out.attempts) == 3
    assert len(out.train["faults"]) == 3  # the permanent variant fires on every attempt
    recorded = json.loads((root / "permanent" / SUPERVISOR_FILE).read_text())["attempts"]
    assert [a["status"] for a in recorded] == ["retryable"] * 3


def test_restarts_without_progress_stop_early(root):
    cfg = tiny_config(*FAST, "faults=exception", "faults.at_step=2", "faults.repeat=every_attempt",
                      "training.supervisor.max_restarts=10", "training.supervisor.max_restarts_without_progress=1")
    out = run_tiny(cfg, root / "stalled", root / "cache")
    assert out.status == "failed" and "no progress" in out.reason
    assert out.train["restarts"] == 1


def test_a_fatal_error_is_not_retried(root):
    out = run_tiny(tiny_config(*FAST, "training.optimizer.lr=-1.0"), root / "fatal", root / "cache")
    assert out.status == "failed" and "Invalid learning rate" in out.reason
    assert out.train["restarts"] == 0 and len(out.attempts) == 1
