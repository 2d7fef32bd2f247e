"""One source for every default: the config dataclasses are Hydra schemas, YAML only overrides.

A YAML value and the dataclass default it stands beside must agree wherever both exist (a
test plants a disagreement to show the check bites), a family's own YAML repeats none of its
dataclass's defaults, and what composes is the dataclass's defaults exactly.
"""

import dataclasses
import inspect
from importlib import resources
from pathlib import Path

import pytest
import yaml
from hydra import compose, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.utils import get_method
from omegaconf import OmegaConf

from speclab.configs.schemas import FAMILIES, SOURCES, source_fields
from speclab.eval.method import MethodConfig
from speclab.speculator.families import REGISTRY
from speclab.training.checkpoint import CheckpointConfig
from speclab.training.data_config import DataConfig
from speclab.training.faults import FaultConfig
from speclab.training.supervisor import SupervisorConfig
from speclab.training.watchdog import WatchdogConfig

CONFIGS = Path(str(resources.files("speclab.configs")))


def dataclass_defaults(cls: type) -> dict:
    return {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
            for f in dataclasses.fields(cls)}


def signature_defaults(fn) -> dict:
    return {name: p.default for name, p in inspect.signature(fn).parameters.items()
            if p.default is not inspect.Parameter.empty}


def disagreements(values: dict, defaults: dict, prefix: str = "") -> list[str]:
    """`key: yaml value != default` for each key set in YAML whose default differs."""
    return [f"{prefix}{key}: YAML {value!r} != default {defaults[key]!r}"
            for key, value in values.items() if key in defaults and defaults[key] != value]


def yaml_section(path: str, *keys: str) -> dict:
    node = yaml.safe_load((CONFIGS / path).read_text()) or {}
    for key in keys:
        node = node.get(key, {})
    return {k: v for k, v in node.items() if k not in ("defaults", "family", "_target_")}


def declared() -> list[tuple[str, dict, dict]]:
    """(where, what the YAML sets, the dataclass's or builder's defaults) wherever both exist."""
    pairs = [(f"speculator/{family}.yaml", yaml_section(f"speculator/{family}.yaml"), dataclass_defaults(cls.Config))
             for family, cls in REGISTRY.items()]
    pairs += [("training/default.yaml: watchdog", yaml_section("training/default.yaml", "watchdog"),
               dataclass_defaults(WatchdogConfig)),
              ("training/default.yaml: supervisor", yaml_section("training/default.yaml", "supervisor"),
               dataclass_defaults(SupervisorConfig)),
              ("eval/default.yaml: method", yaml_section("eval/default.yaml", "method"), dataclass_defaults(MethodConfig)),
              ("faults/none.yaml", yaml_section("faults/none.yaml"), dataclass_defaults(FaultConfig))]
    training = yaml_section("training/default.yaml")  # CheckpointConfig reads the checkpoint_* keys
    pairs.append(("training/default.yaml: checkpoint_*",
                  {k.removeprefix("checkpoint_"): v for k, v in training.items() if k.startswith("checkpoint_")},
                  dataclass_defaults(CheckpointConfig)))
    # The data group has no schema (configs/schemas.py says why): each source file is whole,
    # and the default source's file (config.yaml's `data: self_distill`) states DataConfig's defaults.
    pairs.append(("data/self_distill.yaml", yaml_section("data/self_distill.yaml"), dataclass_defaults(DataConfig)))
    for path in sorted((CONFIGS / "target").glob("*.yaml")):  # a target's YAML is its builder's call
        builder = get_method(yaml.safe_load(path.read_text())["_target_"])
        pairs.append((f"target/{path.name}", yaml_section(f"target/{path.name}"), signature_defaults(builder)))
    return pairs


@pytest.mark.parametrize("where, values, defaults", declared(), ids=[w for w, _, _ in declared()])
def test_a_yaml_value_agrees_with_its_default(where, values, defaults):
    assert not disagreements(values, defaults), where


def test_a_planted_disagreement_fails():
    # draft_vocab_size was 0 in MLPConfig and 8192 in mlp.yaml; the dataclass now says 8192 (docs/design.md)
    planted = dict(yaml_section("speculator/mlp.yaml"), draft_vocab_size=0)
    assert disagreements(planted, dataclass_defaults(REGISTRY["mlp"].Config)) == [
        "draft_vocab_size: YAML 0 != default 8192"]


@pytest.mark.parametrize("family", sorted(REGISTRY))
def test_a_familys_yaml_only_names_its_schema(family):
    """YAML only overrides: a family's own file repeats no default (its dataclass is the source)."""
    text = (CONFIGS / "speculator" / f"{family}.yaml").read_text()
    assert {"/schema/speculator@_here_": family} in yaml.safe_load(text)["defaults"]
    assert not yaml_section(f"speculator/{family}.yaml"), f"{family}.yaml sets keys its dataclass declares"


def _compose(overrides):
    GlobalHydra.instance().clear()
    with initialize_config_module("speclab.configs", version_base=None):
        return compose("config", overrides=overrides)


@pytest.mark.parametrize("family", sorted(REGISTRY))
def test_a_family_composes_to_its_dataclass_defaults(family):
    composed = OmegaConf.to_container(_compose([f"speculator={family}", "target=tiny"]).speculator)
    expected = {"family": family, **dataclass_defaults(REGISTRY[family].Config)}
    if family == "hybrid":  # its learned part composes from that family's own file
        expected["learned"] = {"family": "mlp", **dataclass_defaults(REGISTRY["mlp"].Config)}
    assert composed == expected


def test_sections_compose_to_their_dataclass_defaults():
    cfg = _compose(["target=tiny"])
    sections = {"watchdog": (cfg.training.watchdog, WatchdogConfig), "supervisor": (cfg.training.supervisor, SupervisorConfig),
                "method": (cfg.eval.method, MethodConfig), "fault": (cfg.faults, FaultConfig)}
    assert {name for group, name in SOURCES if group != FAMILIES} == set(sections)
    for node, cls in sections.values():
        assert OmegaConf.to_container(node) == dataclass_defaults(cls), cls.__name__


def test_the_schemas_read_from_source_are_the_live_dataclasses():
    assert {name for group, name in SOURCES if group == FAMILIES} == set(REGISTRY)
    for (group, name), (module, cls_name) in SOURCES.items():
        live = getattr(__import__(module, fromlist=[cls_name]), cls_name)
        if group == FAMILIES:
            assert live is REGISTRY[name].Config
        fields = source_fields(module, cls_name)
        assert [f[0] for f in fields] == [f.name for f in dataclasses.fields(live)], cls_name
        read = {n: d.default if d.default is not dataclasses.MISSING else d.default_factory() for n, _, d in fields}
        assert read == dataclass_defaults(live), cls_name


def test_a_value_of_the_wrong_type_is_refused_at_composition():
    with pytest.raises(Exception, match="inner_dim"):
        _compose(["speculator=mlp", "speculator.inner_dim=wide", "target=tiny"])


def test_the_schemas_are_not_speculator_options():
    # `speculator=glob(*)` (the arch sweep) lists the group's files: the schemas live elsewhere
    assert not (CONFIGS / "speculator" / "schema").exists()
    assert {p.stem for p in (CONFIGS / "speculator").glob("*.yaml")} >= set(REGISTRY)
