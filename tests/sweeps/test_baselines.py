"""score_baselines: each training-free baseline scored once per config in the sweep's folder,
and a relaunch with other settings never overwrites an earlier completed baseline."""

import pytest
from omegaconf import OmegaConf

from speclab.sweeps import experiment
from speclab.sweeps.baselines import BASELINES, score_baselines
from speclab.sweeps.results import new_result, read_result, write_result


@pytest.fixture
def scored(monkeypatch):
    """run_experiment replaced by a record of its calls that writes a completed result.json."""
    calls = []

    def fake_run(cfg, run_dir):
        calls.append(run_dir)
        write_result(run_dir, new_result(run_dir.name, OmegaConf.to_container(cfg, resolve=True)))

    monkeypatch.setattr(experiment, "run_experiment", fake_run)
    return calls


def sweep_config(max_tokens: int):
    return OmegaConf.create({"data": {"max_tokens": max_tokens}, "eval": {"humaneval_prompts": 16},
                             "speculator": {"family": "mlp"}, "run_name": "x"})


def test_a_relaunch_with_other_settings_keeps_the_earlier_baselines(tmp_path, scored):
    first = score_baselines(sweep_config(30000), tmp_path)
    assert [d.name for d in first] == [f"baseline-{f}" for f in BASELINES] and scored == first
    assert score_baselines(sweep_config(30000), tmp_path) == first and len(scored) == len(BASELINES)  # resumed

    second = score_baselines(sweep_config(100000), tmp_path)
    assert len(scored) == 2 * len(BASELINES) and not set(second) & set(first)
    assert all(d.name.startswith(f"baseline-{f}-") for d, f in zip(second, BASELINES))
    for d in first:  # the first launch's results are untouched
        assert read_result(d)["config"]["data"]["max_tokens"] == 30000
    for d in second:
        assert read_result(d)["config"]["data"]["max_tokens"] == 100000
    # a third launch at either budget finds its own baselines done
    assert score_baselines(sweep_config(100000), tmp_path) == second
    assert score_baselines(sweep_config(30000), tmp_path) == first and len(scored) == 2 * len(BASELINES)


def test_a_failed_baseline_is_scored_again_in_its_place(tmp_path, scored):
    (tmp_path / "baseline-ngram").mkdir()
    failed = new_result("baseline-ngram", {"data": {"max_tokens": 1}})
    failed["status"] = "failed"
    write_result(tmp_path / "baseline-ngram", failed)
    dirs = score_baselines(sweep_config(30000), tmp_path)
    assert [d.name for d in dirs] == [f"baseline-{f}" for f in BASELINES]
    assert read_result(tmp_path / "baseline-ngram")["status"] == "completed"
