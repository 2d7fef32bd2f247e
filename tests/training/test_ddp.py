"""Data-parallel training for real: two CPU processes (gloo) on the tiny target, started and
restarted as one group by the supervisor, against one process with the same global batch."""

from __future__ import annotations

import json

import pytest

from speclab.training.fault_matrix import run_tiny, tiny_config
from speclab.training.supervisor import SUPERVISOR_FILE

# 2 x 2 sequences a step on two ranks, 4 on one: the same global batch, the same seed.
STEPS = ["training.max_steps=10", "training.checkpoint_every_n_steps=4", "training.supervisor.collective_timeout_s=10"]
TWO = ["training.strategy=ddp", "training.devices=2", "training.batch_size=2", *STEPS]
ONE = ["training.batch_size=4", *STEPS]
# The ranks' losses and gradients are summed by gloo in another order than one process sums
# its batch: fp32 rounding, a few ulps of a loss near 4 (measured: 5e-7).
LOSS_TOL = 1e-5


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("features")


@pytest.fixture(scope="module")
def clean_two(tmp_path_factory, cache):
    out = run_tiny(tiny_config(*TWO), tmp_path_factory.mktemp("two"), cache)
    assert out.status == "completed", out.reason
    return out


def _curves_agree(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b)
    return max(abs(x - y) for x, y in zip(a, b))


def test_two_processes_train_the_one_process_loss_curve(clean_two, tmp_path, cache):
    one = run_tiny(tiny_config(*ONE), tmp_path / "one", cache)
    assert one.status == "completed", one.reason
    two = clean_two.train
    assert two["world_size"] == 2 and one.train["world_size"] == 1
    assert two["samples"]["order_sha256"] == one.train["samples"]["order_sha256"]  # the same global batches
    assert two["steps"] == one.train["steps"] == 10
    assert _curves_agree(two["loss_history"], one.train["loss_history"]) <= LOSS_TOL
    assert two["loss_history"][-1] < two["loss_history"][0]  # it trained


def test_a_rank_killed_mid_epoch_restarts_the_whole_group(clean_two, tmp_path, cache):
    out = run_tiny(tiny_config(*TWO, "faults=sigkill", "faults.at_step=6", "faults.rank=1"), tmp_path, cache)
    assert out.status == "completed", out.reason
    first = json.loads((tmp_path / SUPERVISOR_FILE).read_text())["attempts"][0]
    assert first["reason"] == "rank 1: killed by signal SIGKILL" and first["world_size"] == 2
    assert out.train["restarts"] == 1 and out.train["faults"][0]["rank"] == 1
    assert out.train["final_weights_sha256"] == clean_two.train["final_weights_sha256"]
    assert out.train["loss_history"] == clean_two.train["loss_history"]


def test_a_checkpoint_damaged_by_one_rank_is_quarantined_once_and_the_group_resumes(clean_two, tmp_path, cache):
    """Rank 1 damages the newest checkpoint, then fails: on the restart rank 0 alone
    quarantines it (two ranks renaming one directory raced) and both resume from the one before."""
    out = run_tiny(tiny_config(*TWO, "faults=corrupt_checkpoint", "faults.at_step=9", "faults.rank=1"), tmp_path, cache)
    assert out.status == "completed", out.reason
    assert out.train["restarts"] == 1 and (tmp_path / "checkpoints" / "corrupt-step-00000008").is_dir()
    assert out.train["final_weights_sha256"] == clean_two.train["final_weights_sha256"]


def test_a_loss_spike_on_one_rank_rolls_every_rank_back(tmp_path, cache):
    out = run_tiny(tiny_config(*TWO, "training.max_steps=16", "faults=spike", "faults.at_step=10", "faults.rank=1",
                               "faults.spike_factor=50"), tmp_path, cache)
    assert out.status == "completed", out.reason
    assert out.train["rollbacks"] == 1 and out.train["restarts"] == 0
    assert out.train["rollback_log"][0]["target"] < 10 <= out.train["rollback_log"][0]["step"]


def test_a_hung_rank_is_caught_and_the_group_restarted(clean_two, tmp_path, cache):
    out = run_tiny(tiny_config(*TWO, "faults=hang", "faults.at_step=6", "faults.rank=1",
                               "training.supervisor.collective_timeout_s=5", "training.supervisor.heartbeat_timeout_s=30"),
                   tmp_path, cache)
    assert out.status == "completed", out.reason
    assert out.train["restarts"] == 1
    assert out.train["final_weights_sha256"] == clean_two.train["final_weights_sha256"]


def test_a_checkpoint_is_refused_on_another_world_size(tmp_path, cache):
    assert run_tiny(tiny_config(*TWO), tmp_path, cache).status == "completed"
    out = run_tiny(tiny_config(*ONE[:-3], "training.max_steps=14", *STEPS[1:]), tmp_path, cache)
    assert out.status == "failed" and out.train["restarts"] == 0
    assert out.reason == ("ValueError: checkpoint step 10 was trained on 2 process(es) and this run has 1: "
                          "resume with training.devices=2, or train in a new run directory")
