"""Renamed and misspelt speculator options are refused before any work, in one line."""

import os
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra

from speclab.sweeps.config_check import ConfigRangeError, check_config, check_overrides


@pytest.mark.parametrize("overrides, message", [
    (["speculator=medusa", "speculator.num_heads=3"],
     "speculator.num_heads was renamed: medusa takes speculator.n_predict (the longest draft chain)"),
    (["speculator=mlp,hydra", "speculator.num_heads=3"],
     "speculator.num_heads was renamed: hydra takes speculator.n_predict (the longest draft chain)"),
    (["speculator=hybrid", "speculator@speculator.learned=medusa", "speculator.learned.num_heads=3"],
     "speculator.learned.num_heads was renamed: medusa takes speculator.learned.n_predict (the longest draft chain)"),
    (["speculator=lstm", "speculator.tie_weights=per_stage"],
     "speculator.tie_weights=per_stage is now a bool: speculator.tie_weights=false"),
    (["speculator.widht=3"],  # mlp, config.yaml's default family
     "unknown mlp speculator option speculator.widht; valid: ['draft_vocab_size', 'inner_dim', 'n_predict', "
     "'tie_weights']"),
])
def test_command_line_overrides_name_the_new_or_the_valid_keys(overrides, message):
    with pytest.raises(ConfigRangeError) as err:
        check_overrides(overrides)
    assert str(err.value) == f"invalid config: {message}"


def test_valid_overrides_pass():
    check_overrides(["speculator=medusa,hydra", "speculator.n_predict=3", "+sweep=arch"])
    check_overrides(["speculator=glob(*)", "speculator.n_predict=3"])  # a family a sweep picks: checked after composing
    check_overrides(["speculator=draft_lm", "speculator.num_heads=2"])  # attention heads: a draft_lm option


def test_an_old_name_added_with_plus_is_refused_after_composition():
    # `+` lets Hydra add any key; the composed config is checked before any work
    GlobalHydra.instance().clear()
    with initialize_config_module("speclab.configs", version_base=None):
        cfg = compose("config", overrides=["speculator=hydra", "+speculator.num_heads=3", "target=tiny"])
    with pytest.raises(ConfigRangeError, match="num_heads was renamed: hydra takes speculator.n_predict"):
        check_config(cfg)


def test_speclab_train_refuses_an_old_name_in_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-c", "from speclab.sweeps.cli import main; raise SystemExit(main())",
                           "train", "speculator=medusa", "speculator.num_heads=3", "target=tiny", f"runs_dir={tmp_path}"],
                          capture_output=True, text=True, cwd=tmp_path, env=dict(os.environ), timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("speclab train: invalid config: speculator.num_heads was renamed: "
                                   "medusa takes speculator.n_predict (the longest draft chain)")
    assert not any(tmp_path.iterdir())  # nothing was built


def test_fsdp_on_a_cpu_target_is_refused_before_any_work():
    """torch's FSDP shards on accelerators only: on CPU the data-parallel strategy is ddp."""
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module="speclab.configs", version_base=None):
        cpu = compose("config", overrides=["target=tiny", "training.strategy=fsdp", "training.devices=2"])
        gpu = compose("config", overrides=["target=tiny", "training.strategy=fsdp", "target.device=cuda"])
    with pytest.raises(ConfigRangeError, match=r"^invalid config: training.strategy=fsdp needs target.device=cuda "
                                               r"\(got 'cpu'\); CPU processes train data-parallel with training.strategy=ddp$"):
        check_config(cpu)
    check_config(gpu)
