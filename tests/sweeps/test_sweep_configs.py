"""Every shipped sweep config composes, names real families, and its launchers compose."""

from pathlib import Path

import pytest
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra

from speclab.speculator import families  # noqa: F401 - fills the registry
from speclab.speculator.base import REGISTRY, speculator_class
from speclab.sweeps import train as _train  # noqa: F401 - registers the speclab_digest resolver
from speclab.sweeps.sweep import available_sweeps

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
    names = {p.stem for p in CANDIDATES.glob("*.yaml")}
    assert names == {f"{family}_{size}" for family in REGISTRY for size in ("small", "large")}


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
    assert options == set(REGISTRY)


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
