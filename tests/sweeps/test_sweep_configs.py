"""Every shipped sweep config composes, names real families, and its launchers compose."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra

from speclab.speculator.families import REGISTRY, speculator_class
from speclab.sweeps import train as _train  # noqa: F401 - registers the speclab_digest resolver
from speclab.sweeps.sweep import available_sweeps
from speclab.speculator.lookup import TrainingFree
from speclab.sweeps.baselines import baseline_config
from speclab.sweeps.table import BASELINE_FAMILIES

CANDIDATES = Path(__import__("speclab.configs", fromlist=["x"]).__file__).parent / "sweep" / "candidate"


def _compose(overrides):
    GlobalHydra.instance().clear()
    with initialize_config_module("speclab.configs", version_base=None):
        return compose("config", overrides=overrides, return_hydra_config=True)


def test_the_predefined_sweeps_are_shipped():
    assert {"quick", "arch", "size", "arch_x_size", "halving", "search"} <= set(available_sweeps())


@pytest.mark.parametrize("name", available_sweeps())
def test_every_sweep_composes_as_a_resumable_multirun(name):
    cfg = _compose([f"+sweep={name}", "target=tiny"])
    assert str(cfg.hydra.mode) == "RunMode.MULTIRUN"
    assert cfg.resume == "skip_completed"
    assert cfg.hydra.sweeper.params, f"sweep {name} sweeps nothing"
    assert "${hydra.runtime.choices.sweep}" in cfg.hydra.sweep._get_node("dir")._value()


def test_every_family_has_a_small_and_a_large_candidate():
    # The training-free baselines have no size to sweep: every sweep scores them (sweeps/baselines.py).
    learned = {family for family, cls in REGISTRY.items() if not issubclass(cls, TrainingFree)}
    assert learned and not learned & set(BASELINE_FAMILIES)
    names = {p.stem for p in CANDIDATES.glob("*.yaml")}
    assert names == {f"{family}_{size}" for family in learned for size in ("small", "large")}


@pytest.mark.parametrize("name", available_sweeps())
def test_every_sweep_scores_the_baselines_with_its_own_settings(name):
    cfg = _compose([f"+sweep={name}", "target=tiny", "eval.max_new_tokens=7"])
    assert cfg.hydra.callbacks.baselines._target_ == "speclab.sweeps.baselines.ScoreBaselines"
    for family in BASELINE_FAMILIES:
        baseline = baseline_config(cfg, family)
        assert baseline.speculator.family == family and "hydra" not in baseline
        assert baseline.eval == cfg.eval and baseline.data == cfg.data and baseline.target == cfg.target
        speculator_class(family).Config(**{k: v for k, v in baseline.speculator.items() if k != "family"})


@pytest.mark.parametrize("candidate", sorted(p.stem for p in CANDIDATES.glob("*.yaml")))
def test_every_candidate_composes_into_its_familys_valid_options(candidate):
    cfg = _compose(["+sweep=arch_x_size", f"+sweep/candidate={candidate}", "target=tiny"])
    family = cfg.speculator.family
    assert candidate.startswith(family + "_")
    options = {k for k in cfg.speculator if k != "family"}
    speculator_class(family).Config(**{k: cfg.speculator[k] for k in options})  # raises on a bad knob


def test_arch_sweeps_every_family_config():
    cfg = _compose(["+sweep=arch", "target=tiny"])
    assert cfg.hydra.sweeper.params.speculator == "glob(*)"
    options = {p.stem for p in (CANDIDATES.parent.parent / "speculator").glob("*.yaml")}
    assert set(REGISTRY) <= options  # every family, plus variants such as suffix_corpus
    for option in options - set(REGISTRY):
        assert _compose([f"speculator={option}", "target=tiny"]).speculator.family in REGISTRY, option


@pytest.mark.parametrize("launcher", ["basic", "joblib", "submitit_local", "submitit_slurm"])
def test_launchers_compose(launcher):
    cfg = _compose(["+sweep=quick", f"hydra/launcher={launcher}", "target=tiny"])
    assert launcher.split("_")[0] in cfg.hydra.launcher._target_.lower()


def test_ddp_knobs_compose():
    cfg = _compose(["training.devices=4", "training.strategy=ddp"])
    assert cfg.training.devices == 4 and cfg.training.strategy == "ddp"


def test_search_is_optuna_tpe_maximising_speedup():
    cfg = _compose(["+sweep=search", "target=tiny"])
    assert "optuna" in cfg.hydra.sweeper._target_.lower() and "TPE" in cfg.hydra.sweeper.sampler._target_
    assert cfg.hydra.sweeper.direction == "maximize"


def test_halving_is_the_speclab_sweeper_ranking_by_a_measured_metric():
    cfg = _compose(["+sweep=halving", "target=tiny"])
    assert cfg.hydra.sweeper._target_ == "hydra_plugins.speclab_halving_sweeper.halving_sweeper.SuccessiveHalvingSweeper"
    assert cfg.hydra.sweeper.metric in ("speedup", "acceptance_length")


def test_parallel_crosses_block_size_layers_and_width_of_a_block_drafter():
    cfg = _compose(["+sweep=parallel", "target=tiny"])
    params = cfg.hydra.sweeper.params
    assert params["speculator"] == "dflash"
    assert [int(v) for v in params["speculator.block_size"].split(",")] == [4, 8, 16]
    assert [int(v) for v in params["speculator.num_layers"].split(",")] == [1, 2]
    assert len(params["speculator.intermediate_size"].split(",")) >= 2


def test_data_scaling_crosses_budgets_recipes_and_families_on_one_eval_set():
    params = _compose(["+sweep=data_scaling", "target=tiny"]).hydra.sweeper.params
    budgets = [int(b) for b in params["data.max_tokens"].split(",")]
    assert budgets == sorted(budgets) and {30_000, 100_000, 300_000, 1_000_000} <= set(budgets)
    assert set(params["speculator"].split(",")) >= {"mlp", "hydra", "eagle3", "dflash", "dspark"}
    recipes = params["+sweep/recipe"].split(",")
    assert set(recipes) == {"self_distilled", "teacher_forced", "two_stage"}
    composed = {r: _compose(["+sweep=data_scaling", f"+sweep/recipe={r}", "target=tiny"]) for r in recipes}
    assert {r: c.data.source for r, c in composed.items()} == {
        "self_distilled": "code_prompts", "teacher_forced": "code_corpus", "two_stage": "code_prompts"}
    assert [dict(s.data) for s in composed["two_stage"].training.stages] == [
        {"source": "code_corpus", "num_prompts": 64}, {}]
    assert not composed["self_distilled"].training.stages and not composed["teacher_forced"].training.stages
    # stage 1 of two_stage is teacher_forced's data exactly: one corpus cache serves both
    from speclab.training.data_config import DataConfig, fields_that_matter
    from speclab.training.stages import stage_configs, stage_data

    stage_one = stage_data(dict(composed["two_stage"].data), stage_configs(composed["two_stage"].training)[0])
    assert fields_that_matter(DataConfig(**stage_one)) == fields_that_matter(DataConfig(**composed["teacher_forced"].data))
    assert len({(c.eval.humaneval_prompts, c.eval.heldout_prompts, c.eval.prompts_file) for c in composed.values()}) == 1
    assert composed["two_stage"].eval.heldout_prompts == 0
