"""Warm start (training.init_from): a run begins from a saved speculator's weights, or refuses."""

import hashlib
import json
import shutil

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from speclab.speculator.base import TargetInfo
from speclab.speculator.families import build_speculator, load_speculator
from speclab.sweeps import experiment
from speclab.sweeps.config_check import ConfigRangeError, check_config
from speclab.training.checkpoint import CheckpointConfig, CheckpointStore, complete_steps, step_dir_name
from speclab.training.fault_matrix import tiny_config
from speclab.training.warm_start import describe_start, warm_start

TARGET = TargetInfo(vocab_size=96, hidden_size=24, num_layers=2)


def mlp(seed: int, **options):
    torch.manual_seed(seed)
    return build_speculator("mlp", {"inner_dim": 16, "n_predict": 2, **options}, TARGET)


def equal_weights(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.fixture
def saved(tmp_path):
    """A trained mlp where a completed run keeps it: (the model, the run directory, its speculator directory)."""
    source = mlp(seed=1)
    found = source.save(tmp_path / "run" / "checkpoints" / "speculator")
    return source, tmp_path / "run", found


def test_the_weights_are_loaded_whole(saved):
    source, _, found = saved
    fresh = mlp(seed=2)
    assert not equal_weights(fresh, source)  # the check below can fail
    warm_start(fresh, found)
    assert equal_weights(fresh, source)
    weights = found / "model.safetensors"
    assert describe_start(found) == {"path": str(found),
                                     "weights_sha256": hashlib.sha256(weights.read_bytes()).hexdigest()}


def test_another_family_is_refused_naming_both(saved):
    _, _, found = saved
    config = found / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "family": "hydra"}))
    with pytest.raises(ValueError, match="holds a hydra speculator; this run trains mlp"):
        warm_start(mlp(seed=2), found)


def test_another_shape_is_refused(saved):
    _, _, found = saved
    with pytest.raises(ValueError, match="does not fit this run's mlp speculator"):
        warm_start(mlp(seed=4, inner_dim=32), found)


def test_another_target_is_refused(saved):
    _, _, found = saved
    torch.manual_seed(5)
    other = build_speculator("mlp", {"inner_dim": 16, "n_predict": 2}, TargetInfo(vocab_size=128, hidden_size=24,
                                                                                num_layers=2))
    with pytest.raises(ValueError, match="vocab 96 and hidden 24; this run's has 128 and 24"):
        warm_start(other, found)


def test_damaged_files_are_refused(saved):
    _, _, found = saved
    weights = found / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-40])
    with pytest.raises(ValueError, match="does not fit"):
        warm_start(mlp(seed=7), found)
    (found / "config.json").write_text(json.dumps({"family": "mlp"}))  # no target
    with pytest.raises(ValueError, match="corrupt speculator config"):
        warm_start(mlp(seed=7), found)


def test_the_config_check_refuses_a_bad_start_before_any_work(saved, tmp_path):
    _, run, found = saved

    def check(path):
        check_config(OmegaConf.create(tiny_config(f"training.init_from={path}")))

    check(run)  # an mlp run from an mlp passes, given its run directory or its speculator's
    check(found)
    with pytest.raises(ConfigRangeError, match="training.init_from: .*nowhere is not a directory"):
        check(tmp_path / "nowhere")
    with pytest.raises(ConfigRangeError, match="training.init_from: .* holds no speculator checkpoint"):
        check(tmp_path)
    config = found / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "family": "hydra"}))
    with pytest.raises(ConfigRangeError, match="holds a hydra speculator; this run trains mlp"):
        check(run)


def test_a_warm_run_starts_from_the_saved_weights_and_resumes_from_its_own(tmp_path, monkeypatch):
    """A tiny mlp run trains 2 steps; a second run warm-started from it saves exactly those
    weights as its step 0 and records where they came from; run again after losing its last
    checkpoint, with the first run gone, it resumes from its own step 0, ends equal and keeps
    the record."""
    monkeypatch.setenv("SPECLAB_CACHE", str(tmp_path / "cache"))
    common = ["training.max_steps=2", "training.precision=fp32", "data.num_prompts=8", "data.max_response_tokens=16",
              "data.heldout_size=1", "eval.max_new_tokens=4", "eval.humaneval_prompts=1", "eval.heldout_prompts=0",
              f"runs_dir={tmp_path / 'runs'}"]
    first, second = tmp_path / "runs" / "first", tmp_path / "runs" / "second"
    for run in (first, second):
        run.mkdir(parents=True)
    assert experiment.run_experiment(OmegaConf.create(tiny_config(*common)), first)["status"] == "completed"
    saved = first / "checkpoints" / "speculator"
    target = instantiate(OmegaConf.create(tiny_config(*common)).target)
    source = load_speculator(saved, TargetInfo.of(target)).state_dict()
    started = describe_start(saved)

    config = OmegaConf.create(tiny_config(*common, f"training.init_from={first}"))
    result = experiment.run_experiment(config, second)
    assert result["status"] == "completed" and result["train"]["steps"] == 2
    assert result["train"]["init_from"] == started
    store = CheckpointStore(second / "checkpoints", CheckpointConfig())
    start, end = store.load(0)["model"], store.load(2)["model"]
    assert start.keys() == source.keys() and all(torch.equal(start[k], source[k]) for k in source)
    assert any(not torch.equal(start[k], end[k]) for k in start)  # and it trained on from there

    shutil.rmtree(first)
    for step in complete_steps(second / "checkpoints"):
        if step > 0:
            shutil.rmtree(second / "checkpoints" / step_dir_name(step))
    again = experiment.run_experiment(config, second)
    assert again["status"] == "completed" and again["train"]["init_from"] == started
    resumed = store.load(2)["model"]
    assert all(torch.equal(resumed[k], end[k]) for k in end)
