"""run_experiment's parent process: what it holds while the supervised child trains."""

import gc

import pytest
from omegaconf import OmegaConf

from speclab.speculator.target import FrozenTarget
from speclab.sweeps import experiment
from speclab.training.fault_matrix import tiny_config


def live_targets() -> int:
    gc.collect()
    return sum(isinstance(obj, FrozenTarget) for obj in gc.get_objects())


def test_the_parent_drops_its_target_while_the_child_trains(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECLAB_CACHE", str(tmp_path / "cache"))
    cfg = OmegaConf.create(tiny_config("training.max_steps=2", "data.num_prompts=8", "data.max_response_tokens=16",
                                       "data.heldout_size=1", "eval.max_new_tokens=4", "eval.humaneval_prompts=1",
                                       "eval.heldout_prompts=1", f"runs_dir={tmp_path / 'runs'}"))
    during = []
    real = experiment.supervise

    def watched(*args, **kwargs):
        during.append(live_targets())
        return real(*args, **kwargs)

    monkeypatch.setattr(experiment, "supervise", watched)
    run_dir = tmp_path / "runs" / "one"
    run_dir.mkdir(parents=True)  # Hydra makes it in a real run
    before = live_targets()
    result = experiment.run_experiment(cfg, run_dir)
    assert result["status"] == "completed" and result["lossless"]["mismatches"] == 0
    assert during == [before]  # no target of this run alive in the parent during training
    assert live_targets() == before  # nor after scoring
