"""Exact resumption: a run that crashes and restarts ends bitwise equal to one that did not.

Every run here is a real supervised run on the tiny target (child processes, restarts,
rollbacks). 12 steps of 2 micro-batches of 4 over 32 samples: 4 steps per epoch, 3
epochs, a checkpoint every 3 steps, so resumes land mid-epoch, right after a save, and
inside gradient accumulation.
"""

import pytest
import torch

from speclab.training.checkpoint import complete_steps
from speclab.training.fault_matrix import run_tiny, tiny_config

STEPS, EPOCHS = 12, 3
COMMON = [f"training.max_steps={STEPS}", "training.accumulate_grad_batches=2", "training.checkpoint_every_n_steps=3",
          "training.checkpoint_keep_last=2", "training.checkpoint_anchor_every_n_steps=6",
          "training.supervisor.heartbeat_timeout_s=4"]


def csv_steps(path) -> list[int]:
    """The `step` column of a Lightning CSV log."""
    header, *rows = path.read_text().splitlines()
    column = header.split(",").index("step")
    return [int(row.split(",")[column]) for row in rows]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")

    def run(name: str, *overrides: str):
        return run_tiny(tiny_config(*COMMON, *overrides), root / name, root / "cache")

    run.root = root
    run.clean = run("clean")
    assert run.clean.status == "completed", run.clean.reason
    return run


def test_clean_run_consumes_every_sample_once_per_epoch(runs):
    t = runs.clean.train
    assert t["steps"] == STEPS and len(t["loss_history"]) == STEPS and t["restarts"] == 0 and t["rollbacks"] == 0
    assert t["samples"]["consumed_min"] == t["samples"]["consumed_max"] == EPOCHS


@pytest.mark.parametrize("kind,step,micro", [
    ("exception", 5, 0),    # mid-epoch, 1 step after the save at 3
    ("sigkill", 7, 0),      # right after the save at 6
    ("exception", 8, 1),    # inside gradient accumulation (after the first micro-batch's backward)
    ("sigkill", 11, 1),     # inside accumulation, in the last epoch
    ("hang", 10, 0),        # no heartbeat: the supervisor kills it
    ("corrupt_checkpoint", 8, 0),  # the newest checkpoint (6) is damaged: the restart falls back to 3
])
def test_a_hardware_fault_resumes_bitwise_equal(runs, kind, step, micro):
    out = runs(f"{kind}-{step}-{micro}", f"faults={kind}", f"faults.at_step={step}", f"faults.at_micro_batch={micro}")
    t, clean = out.train, runs.clean.train
    assert out.status == "completed", out.reason
    assert t["restarts"] == 1 and t["rollbacks"] == 0
    assert [(f["kind"], f["step"]) for f in t["faults"]] == [(kind, step)]  # fired once, not again after the restart
    assert t["final_weights_sha256"] == clean["final_weights_sha256"]
    assert t["loss_history"] == clean["loss_history"]  # exact float equality, step by step
    assert t["samples"] == clean["samples"]  # each sample exactly once per epoch, in the same order
    assert t["tokens"] == clean["tokens"]
    failed = t["attempts"][0]
    assert failed["status"] == "retryable" and failed["fault_to_resumed_s"] > 0
    # logs/metrics.csv starts afresh in each attempt; the failed attempt's rows are kept aside
    logs = runs.root / f"{kind}-{step}-{micro}" / "logs"
    first, second = (csv_steps(logs / name) for name in ("metrics.segment-1.csv", "metrics.csv"))
    assert min(second) == t["attempts"][1]["resumed_from"] and set(first) | set(second) == set(range(STEPS))
    assert t["attempts"][1]["resumed_from"] == (3 if kind == "corrupt_checkpoint" else (step - 1) // 3 * 3)


def test_corrupt_checkpoint_is_quarantined(runs):
    assert (runs.root / "corrupt_checkpoint-8-0" / "checkpoints" / "corrupt-step-00000006").is_dir()


@pytest.mark.parametrize("kind,step", [("spike", 6), ("nan_loss", 7)])
def test_spike_and_nan_roll_back_and_complete(runs, kind, step):
    out = runs(f"{kind}-{step}", f"faults='{kind}'", f"faults.at_step={step}")
    t = out.train
    assert out.status == "completed", out.reason
    assert t["rollbacks"] >= 1 and t["restarts"] == 0 and len(t["faults"]) == 1
    first = t["rollback_log"][0]
    assert first["target"] < first["onset"] == step  # back to a checkpoint from before the onset
    assert first["skip"], "the data window that led to the trip is skipped"
    assert t["steps"] == STEPS and all(torch.isfinite(torch.tensor(t["loss_history"])))
    ckpts = complete_steps(runs.root / f"{kind}-{step}" / "checkpoints")
    assert ckpts[-1] == STEPS


def test_a_permanent_spike_exhausts_the_rollback_budget_and_fails(runs):
    out = runs("spike-permanent", "faults=spike", "faults.at_step=6", "faults.repeat=every_attempt",
               "training.watchdog.max_rollbacks=2")
    assert out.status == "failed" and "rollback budget exhausted" in out.reason
    assert out.train["rollbacks"] == 2 and out.train["restarts"] == 0  # fatal: not retried


def test_bf16_training_resumes_bitwise_equal_and_says_so(runs):
    """Under bf16 autocast too: a crash inside gradient accumulation resumes to the same bits.
    Its weights differ from the fp32 run's (the products are bf16), and result.json says which."""
    clean = runs("bf16-clean", "training.precision=bf16")
    crashed = runs("bf16-sigkill-8-1", "training.precision=bf16", "faults=sigkill", "faults.at_step=8",
                   "faults.at_micro_batch=1")
    assert clean.status == crashed.status == "completed", (clean.reason, crashed.reason)
    assert crashed.train["restarts"] == 1
    assert crashed.train["final_weights_sha256"] == clean.train["final_weights_sha256"]
    assert crashed.train["loss_history"] == clean.train["loss_history"]
    assert clean.train["final_weights_sha256"] != runs.clean.train["final_weights_sha256"]
    assert clean.train["precision"] == "bf16" and runs.clean.train["precision"] == "fp32"
    assert clean.train["precision_choice"]["source"] == "config"
