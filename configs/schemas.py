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
named, by `sweeps/config_check.py`. The schemas are read from the dataclasses' source, not
imported: the families import torch (seconds), and composing a config (`--cfg job`, a
sweep's resume check) must not pay for it; a test checks them against the live classes. The
groups stay outside the YAML groups, so a sweep's
`speculator=glob(*)` lists families, not schemas. The data sources (`configs/data/`) are not
schemas yet: each source file is a delta of its own, and a schema would add every
DataConfig field to every run's resolved config (and change every run's resume hash).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

# schema group/name -> (module, dataclass). The families are the registry's
# (speculator/families.py; a test keeps the two equal).
FAMILIES = "schema/speculator"
SOURCES: dict[tuple[str, str], tuple[str, str]] = {
    **{(FAMILIES, family): (f"speclab.speculator.{family}", cls) for family, cls in {
        "dflash": "DFlashConfig", "dflash2": "DFlash2Config", "dspark": "DSparkConfig", "draft_lm": "DraftLMConfig", "eagle": "EagleConfig", "eagle3": "Eagle3Config", "hybrid": "HybridConfig",
        "hydra": "HydraConfig", "lstm": "LSTMConfig", "medusa": "MedusaConfig", "mlp": "MLPConfig",
        "ngram": "NgramConfig", "peagle": "PEagleConfig", "suffix": "SuffixConfig", "xpress": "XPressConfig"}.items()},
    ("schema/training", "watchdog"): ("speclab.training.watchdog", "WatchdogConfig"),
    ("schema/training", "supervisor"): ("speclab.training.supervisor", "SupervisorConfig"),
    ("schema/eval", "method"): ("speclab.eval.method", "MethodConfig"),
    ("schema/faults", "fault"): ("speclab.training.faults", "FaultConfig"),
}
PLAIN = {"int": int, "float": float, "bool": bool, "str": str}

Field = tuple[str, Any, dataclasses.Field]


def _source_file(module: str) -> Path:
    package, _, name = module.rpartition(".")
    return Path(importlib.util.find_spec(package).origin).parent / f"{name}.py"  # the package is not run


def _default(value: ast.expr) -> dataclasses.Field:
    if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "field":
        (keyword,) = value.keywords
        factory = keyword.value
        if keyword.arg == "default":
            return dataclasses.field(default=ast.literal_eval(factory))
        literal = ast.literal_eval(factory.body) if isinstance(factory, ast.Lambda) else {"list": [], "dict": {}}[factory.id]
        return dataclasses.field(default_factory=lambda: type(literal)(literal))
    return dataclasses.field(default=ast.literal_eval(value))


def source_fields(module: str, name: str) -> list[Field]:
    """The fields of dataclass `name` as its source declares them: name, the type OmegaConf
    checks (a Literal, or an alias of one: str; lists, dicts, unions: untyped) and default."""
    tree = ast.parse(_source_file(module).read_text())
    literals = {n.targets[0].id for n in tree.body if isinstance(n, ast.Assign) and len(n.targets) == 1
                and isinstance(n.targets[0], ast.Name) and ast.unparse(n.value).startswith("Literal[")}
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name]
    fields = _base_fields(module, tree, cls)
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            annotation = ast.unparse(node.annotation)
            if annotation.startswith("ClassVar"):
                continue
            kind = PLAIN.get(annotation, str if annotation.startswith("Literal[") or annotation in literals else Any)
            _declare(fields, (node.target.id, kind, _default(node.value)))
    return fields


def _declare(fields: list[Field], field: Field) -> None:
    """Add `field`, or replace one of its name in place: a field declared again (by the class or
    by a second base) keeps its first place, as dataclasses order it."""
    names = [f[0] for f in fields]
    if field[0] in names:
        fields[names.index(field[0])] = field
    else:
        fields.append(field)


def _base_fields(module: str, tree: ast.Module, cls: ast.ClassDef) -> list[Field]:
    """The fields a dataclass inherits (dspark's config extends dflash's): each base class read
    from this module's source, or from the sibling module it is imported from. In dataclasses'
    order: the last base's fields first (eagle3's config has two bases)."""
    fields: list[Field] = []
    for base in reversed(cls.bases):
        if not isinstance(base, ast.Name):
            continue
        if any(isinstance(n, ast.ClassDef) and n.name == base.id for n in tree.body):
            inherited = source_fields(module, base.id)
        else:
            inherited = []
            for node in tree.body:
                if isinstance(node, ast.ImportFrom) and any(a.name == base.id for a in node.names):
                    package = module.rsplit(".", node.level)[0] if node.level else ""
                    inherited = source_fields(f"{package}.{node.module}" if package else node.module, base.id)
        for field in inherited:
            _declare(fields, field)
    return fields


def live_fields(config: type) -> list[Field]:
    """The same, read from a dataclass already imported (a family registered at run time)."""
    fields = []
    for f in dataclasses.fields(config):
        kind = f.type if f.type in PLAIN else (str if str(f.type).startswith("Literal[") else Any)
        default = (dataclasses.field(default=f.default) if f.default is not dataclasses.MISSING
                   else dataclasses.field(default_factory=f.default_factory))
        fields.append((f.name, kind, default))
    return fields


def schema(name: str, fields: list[Field], family: str | None = None) -> type:
    """A dataclass of the fields, with `family` first for a speculator family."""
    head = [("family", str, dataclasses.field(default=family))] if family is not None else []
    return dataclasses.make_dataclass(f"{name}Schema", head + fields)


def family_config(config: type, family: str, overrides: dict) -> dict:
    """A family's config as composing its YAML gives it: the schema's defaults, then the
    file's keys (`overrides`, its `defaults:` list left out)."""
    node = OmegaConf.merge(OmegaConf.structured(schema(config.__name__, live_fields(config), family)), overrides)
    return OmegaConf.to_container(node)


def register() -> None:
    store = ConfigStore.instance()
    for (group, name), (module, cls) in SOURCES.items():
        family = name if group == FAMILIES else None
        store.store(group=group, name=name, node=schema(cls, source_fields(module, cls), family))
