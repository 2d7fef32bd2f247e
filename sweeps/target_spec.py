"""A recorded target description, read as data: the one way a checkpoint or export names its target.

A checkpoint's config.json (or an export's speclab.json) records the run's resolved target
config, e.g. `{"_target_": "speclab.speculator.target.builders.tiny_llama", "seed": 0, ...}`. That file
comes from outside the process, so it is never handed to Hydra: `instantiate` would import
whatever `_target_` names and resolve `${...}` interpolations (`${oc.create:...}` builds a
nested `_target_` of its own). Instead the description is validated against a schema taken
from the target builders themselves:

- `_target_` is only a key into the table of builders (the public functions of
  speclab.speculator.target.builders that return a FrozenTarget); nothing is imported by its name;
- every other key must be a parameter of that builder, and its value a JSON scalar of the
  parameter's annotated type (no dicts, lists, `_`-keys, nor `${` interpolations);

and the builder is then called directly with those arguments. The CLI's eval, bench and
export all go through `recorded_target` / `TargetSpec.build`.
"""

from __future__ import annotations

import importlib
import inspect
import json
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .checkpoint_meta import checkpoint_meta

TARGETS_MODULE = "speclab.speculator.target.builders"
# Checkpoints and exports written while the builders lived in speclab.speculator.targets
# name them there; the name is read as the same builder, never imported.
RECORDED_AS = "speclab.speculator.targets"
BUILDER_KEY = "_target_"
OVERRIDE_PREFIX = "target."
_SCALARS = (str, int, float, bool, type(None))


class TargetSpecError(ValueError):
    """A recorded target description that does not fit the schema (a user-fixable error)."""


def builders() -> dict[str, Callable]:
    """Dotted name -> the public functions of the targets module that return a FrozenTarget."""
    module = importlib.import_module(TARGETS_MODULE)
    found = {}
    for name, fn in vars(module).items():
        if not inspect.isfunction(fn) or fn.__module__ != module.__name__ or name.startswith("_"):
            continue
        try:
            returns = typing.get_type_hints(fn).get("return")
        except NameError:  # an annotation that cannot be resolved: not a builder we can check
            continue
        if returns is getattr(module, "FrozenTarget", None):
            found[f"{TARGETS_MODULE}.{name}"] = fn
    return found


def current_name(builder: Any) -> Any:
    """A recorded builder name in today's module (names under RECORDED_AS map to TARGETS_MODULE)."""
    if isinstance(builder, str) and builder.startswith(RECORDED_AS + "."):
        return TARGETS_MODULE + builder.removeprefix(RECORDED_AS)
    return builder


def _allowed_types(hint) -> tuple | None:
    """The JSON scalar types a parameter annotated `hint` accepts (None: not a plain-data parameter)."""
    if hint in _SCALARS:
        return (int, float) if hint is float else (hint,)  # a float field takes a whole number too
    if typing.get_origin(hint) is typing.Literal:  # membership is checked by _literal_ok
        return tuple({type(arg) for arg in typing.get_args(hint)})
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        parts = [_allowed_types(arg) for arg in typing.get_args(hint)]
        return None if None in parts else tuple(t for part in parts for t in part)
    return None


@dataclass(frozen=True)
class TargetSpec:
    """A validated target description: which builder, with which plain arguments."""

    builder: str
    kwargs: dict[str, Any]

    def as_config(self) -> dict:
        """The description in the recorded `{"_target_": ..., **arguments}` form (for reports)."""
        return {BUILDER_KEY: self.builder, **self.kwargs}

    def build(self):
        """The FrozenTarget: the builder called with the validated arguments."""
        return builders()[self.builder](**self.kwargs)


def parse_target_spec(raw: Any, source: str = "target_config") -> TargetSpec:
    """Validate a recorded target description; raises TargetSpecError naming the bad key."""
    if not isinstance(raw, dict):
        raise TargetSpecError(f"{source}: the target description must be an object, got {type(raw).__name__}")
    table = builders()
    builder = current_name(raw.get(BUILDER_KEY))
    if builder not in table:
        builder = raw.get(BUILDER_KEY)
        raise TargetSpecError(f"{source}: refusing target _target_ {builder!r}; valid: {sorted(table)}")
    hints = typing.get_type_hints(table[builder])
    params = [p for p in inspect.signature(table[builder]).parameters if p in hints]
    kwargs = {}
    for key, value in raw.items():
        if key == BUILDER_KEY:
            continue
        if key not in params:
            raise TargetSpecError(f"{source}: refusing target config key {key!r}: {builder} takes {params}")
        allowed = _allowed_types(hints[key])
        if allowed is None:
            raise TargetSpecError(f"{source}: {builder}'s argument {key!r} is not plain data; it cannot be recorded")
        if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
            raise TargetSpecError(f"{source}: refusing target config key {key!r}: {json.dumps(value)[:80]} is not "
                                  f"a {' or '.join(t.__name__ for t in allowed)}")
        if typing.get_origin(hints[key]) is typing.Literal and value not in typing.get_args(hints[key]):
            raise TargetSpecError(f"{source}: refusing target config key {key!r}: {value!r} is not one of "
                                  f"{list(typing.get_args(hints[key]))}")
        if isinstance(value, str) and "${" in value:
            raise TargetSpecError(f"{source}: refusing target config key {key!r}: interpolations (${{...}}) "
                                  "are not allowed in a recorded target")
        if float in allowed and int in allowed and str not in allowed and isinstance(value, int):
            value = float(value)  # JSON writes 1.0 as 1; the builder's float field gets a float
        kwargs[key] = value
    return TargetSpec(builder, kwargs)


def _override_value(text: str):
    """A target.KEY=VALUE value as a JSON scalar: numbers, true/false/null, else the text itself."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, _SCALARS) else text


def with_overrides(spec: TargetSpec, overrides: list[str]) -> TargetSpec:
    """`spec` with target.KEY=VALUE changes applied, validated like the recorded description."""
    bad = [o for o in overrides if "=" not in o or not o.startswith(OVERRIDE_PREFIX)]
    if bad:
        raise TargetSpecError(f"bad override(s) {bad}: the target takes target.KEY=VALUE changes")
    config = spec.as_config()
    for override in overrides:
        key, text = override.removeprefix(OVERRIDE_PREFIX).split("=", 1)
        value = _override_value(text)
        hint = _allowed_types(typing.get_type_hints(builders()[spec.builder]).get(key)) or ()
        config[key] = text if str in hint and not isinstance(value, hint) else value  # target.name_or_path=123
    return parse_target_spec(config, "target overrides")


def recorded_target(checkpoint: Path, overrides: list[str] = ()) -> TargetSpec:
    """The checkpoint's recorded target (config.json, or an export's speclab.json), with overrides."""
    try:
        meta = checkpoint_meta(checkpoint)
    except ValueError as exc:  # not JSON at all
        raise TargetSpecError(f"{checkpoint}: its config.json is not valid JSON ({exc})") from exc
    if not isinstance(meta, dict) or not isinstance(meta.get("target_config"), dict):
        raise TargetSpecError(f"{checkpoint}/config.json records no target_config, so its target is unknown")
    spec = parse_target_spec(meta["target_config"], f"{checkpoint}/config.json target_config")
    return with_overrides(spec, list(overrides))
