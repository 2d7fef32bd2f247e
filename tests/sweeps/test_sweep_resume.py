"""A run's identity (config_hash): what changes it and what does not."""

from speclab.sweeps.resume import config_hash

RUN = {"seed": 0, "runs_dir": "a", "training": {"epochs": 2, "optimizer": {"lr": 0.003}}, "speculator": {"family": "mlp"}}


def test_where_a_run_goes_does_not_change_its_identity():
    assert config_hash({**RUN, "runs_dir": "b", "run_name": "x"}) == config_hash(RUN)


def test_what_it_computes_does():
    assert config_hash({**RUN, "training": {**RUN["training"], "epochs": 3}}) != config_hash(RUN)


def test_an_unset_later_key_keeps_the_identity_of_runs_from_before_it():
    """training.init_from was added after runs existed: null hashes as absent, a path does not."""
    assert config_hash({**RUN, "training": {**RUN["training"], "init_from": None}}) == config_hash(RUN)
    assert config_hash({**RUN, "training": {**RUN["training"], "init_from": "runs/x"}}) != config_hash(RUN)
