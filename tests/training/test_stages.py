"""Two-stage training (training.stages) is one run: one schedule, checkpoints and exact
resumption across the stage boundary, on the tiny target with synthetic data per stage.

Stage 1 is 6 steps on 24 samples (data seed 7), stage 2 6 steps on 32 samples (seed 0); 2
micro-batches of 4 per step, a checkpoint every 4 steps and at the boundary (step 6).
"""

import pytest
from omegaconf import OmegaConf

from speclab.training.fault_matrix import run_tiny, tiny_config
from speclab.training.stages import stage_configs, stage_data

STAGES = "training.stages=[{data:{num_prompts:24,seed:7},max_steps:6},{max_steps:6}]"
COMMON = ["training.max_steps=12", "training.accumulate_grad_batches=2", "training.checkpoint_every_n_steps=4",
          "training.checkpoint_keep_last=3", "training.checkpoint_anchor_every_n_steps=8",
          "training.supervisor.heartbeat_timeout_s=4"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("stages")

    def run(name: str, *overrides: str):
        return run_tiny(tiny_config(*COMMON, *overrides), root / name, root / "cache")

    run.root = root
    run.clean = run("clean", STAGES)
    assert run.clean.status == "completed", run.clean.reason
    return run


def test_stage_one_trains_its_own_data_then_the_run_switches(runs):
    t = runs.clean.train
    assert t["steps"] == 12 and [s["end_step"] for s in t["stages"]] == [6, 12]
    assert [s["examples"] for s in t["stages"]] == [24, 32]
    # One run on stage 1's data alone, same 12-step schedule: equal for exactly 6 steps.
    alone = runs("stage-one-data-only", "data.num_prompts=24", "data.seed=7")
    assert alone.status == "completed", alone.reason
    assert alone.train["loss_history"][:6] == t["loss_history"][:6]
    assert alone.train["loss_history"][6:] != t["loss_history"][6:]
    # Stage 2's 6 steps x 8 samples over its 32 samples: each once, half of them twice.
    assert (t["samples"]["consumed_min"], t["samples"]["consumed_max"]) == (1, 2)


@pytest.mark.parametrize("kind,step,micro", [
    ("exception", 5, 0),  # inside stage 1: resumes from step 4
    ("exception", 6, 1),  # stage 1's last step, inside gradient accumulation
    ("sigkill", 7, 0),    # stage 2's first step: resumes from the boundary checkpoint
    ("sigkill", 10, 1),   # inside stage 2, inside accumulation: resumes from step 8
])
def test_a_fault_on_either_side_of_the_boundary_resumes_bitwise_equal(runs, kind, step, micro):
    out = runs(f"{kind}-{step}-{micro}", STAGES, f"faults={kind}", f"faults.at_step={step}",
               f"faults.at_micro_batch={micro}")
    t, clean = out.train, runs.clean.train
    assert out.status == "completed", out.reason
    assert t["restarts"] == 1 and [(f["kind"], f["step"]) for f in t["faults"]] == [(kind, step)]
    assert t["final_weights_sha256"] == clean["final_weights_sha256"]
    assert t["loss_history"] == clean["loss_history"] and t["samples"] == clean["samples"]
    assert t["attempts"][1]["resumed_from"] == {5: 4, 6: 4, 7: 6, 10: 8}[step]


def test_a_spike_in_stage_two_rolls_back_inside_it(runs):
    # Stage 2's window starts empty at step 6: from its third loss (step 9) the rule is armed.
    out = runs("spike-10", STAGES, "faults=spike", "faults.at_step=10")
    t = out.train
    assert out.status == "completed", out.reason
    assert t["rollbacks"] == 1 and t["steps"] == 12
    first = t["rollback_log"][0]
    assert 6 <= first["target"] < first["onset"] == 10
    # the skipped window is in stage 2's epochs (numbered from 10,000): stage 1's data is untouched
    assert first["skip"] and all(epoch >= 10_000 for epoch, _, _ in first["skip"])


def test_a_new_stage_at_a_higher_loss_level_is_not_a_spike(runs):
    # Every loss of stage 2 ten times stage 1's: a new data set's level, judged on its own.
    # Against stage 1's window it tripped at step 9 and again after each rollback, until the
    # budget failed the run (two-stage mlp at 1M source tokens, then the target's answers).
    out = runs("level-7", STAGES, "faults=spike", "faults.at_step=7", "faults.spike_steps=6")
    assert out.status == "completed", out.reason
    assert out.train["rollbacks"] == 0 and out.train["steps"] == 12
    assert out.train["loss_history"][6] > 5 * max(out.train["loss_history"][:6])


def test_a_misspelt_stage_key_is_named():
    with pytest.raises(ValueError, match=r"training.stages\[1\]: unknown keys \['epoch'\]"):
        stage_configs(OmegaConf.create({"stages": [{}, {"epoch": 2}]}))
    with pytest.raises(ValueError, match=r"data keys \['sorce'\]"):
        stage_data({"source": "self_distill"}, stage_configs(OmegaConf.create({"stages": [{"data": {"sorce": "x"}}]}))[0])
