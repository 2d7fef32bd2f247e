"""The config dataclasses as Hydra's typed schemas: the one place every default lives.

Each YAML file whose keys a dataclass reads starts from that dataclass's schema (stored in
Hydra's ConfigStore under `schema/...`) and sets only what differs, so a default is declared
once, with its help text, as a field and its docstring:

- `configs/speculator/<name>.yaml`: `/schema/speculator@_here_: <family>`, the family's
  config dataclass plus its `family` key;
- `configs/training/default.yaml`: `watchdog` (WatchdogConfig), `supervisor`
  (SupervisorConfig); `configs/eval/default.yaml`: `method` (MethodConfig);
  `configs/faults/none.yaml`: FaultConfig.

A schema keeps the field types OmegaConf knows (a `Literal[...]` is checked as a str here and
as its choices when the dataclass is built; lists and dicts are untyped), so a value of the
wrong type is refused at composition and a misspelt key by Hydra or, with the valid ones
named, by `sweeps/config_check.py`. The groups stay outside the YAML groups, so a sweep's
`speculator=glob(*)` lists families, not schemas. The data sources (`configs/data/`) are not
schemas yet: each source file is a delta of its own, and a schema would add every
DataConfig field to every run's resolved config (and change every run's resume hash).
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Literal

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from speclab.eval.method import MethodConfig
from speclab.speculator.families import REGISTRY
from speclab.training.faults import FaultConfig
from speclab.training.supervisor import SupervisorConfig
from speclab.training.watchdog import WatchdogConfig

# schema group/name -> dataclass, for every config section that is not a speculator family
SECTIONS: dict[tuple[str, str], type] = {
    ("schema/training", "watchdog"): WatchdogConfig,
    ("schema/training", "supervisor"): SupervisorConfig,
    ("schema/eval", "method"): MethodConfig,
    ("schema/faults", "fault"): FaultConfig,
}
FAMILIES = "schema/speculator"


def _omegaconf_type(hint: Any) -> Any:
    if typing.get_origin(hint) is Literal:
        return str
    return hint if hint in (int, float, bool, str) else Any


def schema(config: type, family: str | None = None) -> type:
    """A dataclass of the config's fields (defaults shared, not copied), with `family` first
    for a speculator family."""
    hints = typing.get_type_hints(config)
    fields: list[tuple[str, Any, dataclasses.Field]] = []
    if family is not None:
        fields.append(("family", str, dataclasses.field(default=family)))
    for f in dataclasses.fields(config):
        default = (dataclasses.field(default=f.default) if f.default is not dataclasses.MISSING
                   else dataclasses.field(default_factory=f.default_factory))
        fields.append((f.name, _omegaconf_type(hints[f.name]), default))
    return dataclasses.make_dataclass(f"{config.__name__}Schema", fields)


def family_config(family: str, overrides: dict) -> dict:
    """A family's config as composing its YAML gives it: the schema's defaults, then the
    file's keys (`overrides`, its `defaults:` list left out)."""
    node = OmegaConf.merge(OmegaConf.structured(schema(REGISTRY[family].Config, family)), overrides)
    return OmegaConf.to_container(node)


def register() -> None:
    store = ConfigStore.instance()
    for family, cls in REGISTRY.items():
        store.store(group=FAMILIES, name=family, node=schema(cls.Config, family))
    for (group, name), config in SECTIONS.items():
        store.store(group=group, name=name, node=schema(config))
