"""Range checks of a composed experiment config, run before any work.

A bad number otherwise fails late or never: `training.batch_size=-1` made Lightning loop
over empty epochs until the supervisor's hang budget ran out (3 x 900 s); `batch_size=0`
failed only after the data build. Each rule names a key, the kind of value and its valid
range; a violation is one line naming both. Keys a config does not have are skipped (a data
source without that field), and `null` passes where the key's default is null.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf

from speclab.configs.schemas import FAMILIES, SOURCES, source_fields
from speclab.speculator.renamed import check_renamed
from speclab.training.warm_start import check_family

from .results import find_speculator_checkpoint


class ConfigRangeError(ValueError):
    """A config value outside its valid range; the message is one line naming the key."""


@dataclass(frozen=True)
class Rule:
    key: str
    kind: type  # int or float (a float key takes a whole number too)
    low: float | None = None  # inclusive bounds
    high: float | None = None
    also: tuple = ()  # special values allowed outside the range (-1: "no limit" / "all")
    exclusive_low: bool = False

    def describe(self) -> str:
        name = "an integer" if self.kind is int else "a number"
        bounds = []
        if self.low is not None:
            bounds.append(f"{'>' if self.exclusive_low else '>='} {self.low:g}")
        if self.high is not None:
            bounds.append(f"<= {self.high:g}")
        special = f" (or {', '.join(map(str, self.also))})" if self.also else ""
        return f"{name} {' and '.join(bounds)}{special}".strip()

    def ok(self, value) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float) if self.kind is float else int):
            return False
        if value in self.also:
            return True
        if not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.exclusive_low else value < self.low):
            return False
        return self.high is None or value <= self.high


def _positive(key: str, kind: type = int, **kw) -> Rule:
    return Rule(key, kind, 0, exclusive_low=True, **kw) if kind is float else Rule(key, int, 1, **kw)


RULES = [
    _positive("training.batch_size"),
    _positive("training.epochs"),
    _positive("training.max_steps", also=(-1,)),
    Rule("training.warmup_steps", int, 0),
    Rule("training.grad_clip", float, 0),
    _positive("training.accumulate_grad_batches"),
    _positive("training.checkpoint_every_n_steps"),
    _positive("training.checkpoint_keep_last"),
    _positive("training.checkpoint_anchor_every_n_steps"),
    Rule("training.checkpoint_keep_anchors", int, 0),
    _positive("training.log_every_n_steps"),
    _positive("training.feature_batch_size"),
    _positive("training.optimizer.lr", float),
    _positive("training.watchdog.window"),
    _positive("training.watchdog.min_window"),
    _positive("training.watchdog.ratio_after"),
    _positive("training.watchdog.sigma", float),
    Rule("training.watchdog.ratio", float, 1, exclusive_low=True),
    _positive("training.watchdog.patience"),
    Rule("training.watchdog.max_rollbacks", int, 0),
    Rule("training.watchdog.lr_backoff", float, 0, 1, exclusive_low=True),
    Rule("training.supervisor.max_restarts", int, 0),
    _positive("training.supervisor.max_restarts_without_progress"),
    Rule("training.supervisor.backoff_s", float, 0),
    Rule("training.supervisor.backoff_max_s", float, 0),
    _positive("training.supervisor.heartbeat_timeout_s", float),
    _positive("training.supervisor.startup_timeout_s", float),
    _positive("training.supervisor.poll_s", float),
    _positive("eval.k"),
    _positive("eval.max_new_tokens"),
    Rule("eval.humaneval_prompts", int, 0, also=(-1,)),
    Rule("eval.heldout_prompts", int, 0),
    Rule("data.num_prompts", int, 0),
    Rule("data.max_tokens", int, 0),
    Rule("data.mix", float, 0, 1),
    Rule("data.heldout_size", int, 0),
    _positive("data.max_seq_len"),
    _positive("data.max_prompt_tokens"),
    _positive("data.max_response_tokens"),
    Rule("data.gen_batch_size", int, 0),  # 0: this machine's choice
    Rule("data.prompt_temperature", float, 0),
    Rule("data.prompt_top_p", float, 0, 1, exclusive_low=True),
    _positive("data.prompt_sampling_budget", float),
    _positive("threads"),
]


def check_config(cfg: DictConfig) -> None:
    """Raise ConfigRangeError for the first value outside its range (before anything is built)."""
    check_speculator(cfg)
    for rule in RULES:
        value = OmegaConf.select(cfg, rule.key, default=None)
        if value is not None and not rule.ok(value):
            raise ConfigRangeError(f"invalid config: {rule.key}={value!r}; valid: {rule.describe()}")
    strategy, device = OmegaConf.select(cfg, "training.strategy", default=None), OmegaConf.select(cfg, "target.device", default="cpu")
    if strategy == "fsdp" and not str(device).startswith("cuda"):  # torch's FSDP shards on accelerators only
        raise ConfigRangeError(f"invalid config: training.strategy=fsdp needs target.device=cuda (got {device!r}); "
                               "CPU processes train data-parallel with training.strategy=ddp")
    init_from, family = OmegaConf.select(cfg, "training.init_from", default=None), OmegaConf.select(cfg, "speculator.family", default=None)
    if init_from and family:  # a missing or mismatched start fails here, not after the data build
        try:
            check_family(find_speculator_checkpoint(init_from), family)
        except FileNotFoundError as exc:
            raise ConfigRangeError(f"invalid config: training.init_from: {exc}") from None
        except (OSError, ValueError) as exc:
            raise ConfigRangeError(f"invalid config: {exc}") from None
    window = OmegaConf.select(cfg, "training.watchdog.window", default=None)
    min_window = OmegaConf.select(cfg, "training.watchdog.min_window", default=None)
    if window is not None and min_window is not None and min_window > window:
        raise ConfigRangeError(f"invalid config: training.watchdog.min_window={min_window} exceeds "
                               f"training.watchdog.window={window}; valid: 1 <= min_window <= window")


def option_names(family: str) -> set[str] | None:
    """The options a family's dataclass declares (read from its source: nothing heavy loads)."""
    if (FAMILIES, family) not in SOURCES:
        return None
    return {name for name, _, _ in source_fields(*SOURCES[FAMILIES, family])}


def check_speculator(cfg: DictConfig) -> None:
    """The speculator's options, as its family's dataclass names them: a misspelt option (one
    added with `+`, which Hydra lets through) or a renamed one fails here, before the data
    build. Values are checked when the dataclass is built."""
    spec = OmegaConf.select(cfg, "speculator", default=None)
    if spec is None:
        return
    parts = [("speculator", OmegaConf.to_container(spec, resolve=True))]
    if isinstance(parts[0][1].get("learned"), dict):  # a hybrid's learned part
        parts.append(("speculator.learned", parts[0][1]["learned"]))
    for where, params in parts:
        family, names = params.get("family"), option_names(params.get("family"))
        try:
            check_renamed(family, params, where)
        except ValueError as exc:
            raise ConfigRangeError(f"invalid config: {exc}") from None
        unknown = sorted(set(params) - (names or set()) - {"family"}) if names is not None else []
        if unknown:
            raise ConfigRangeError(f"invalid config: unknown {family} speculator option(s) "
                                   f"{[f'{where}.{k}' for k in unknown]}; valid: {sorted(names)}")


def check_overrides(overrides: list[str]) -> None:
    """Refuse a renamed or misspelt speculator option given on the command line, naming the
    new name or the valid ones.

    Hydra would refuse it too (the key is not in the family's schema) but without naming
    them; the family is read from `speculator=` (several for a multirun), `mlp` by default
    as in configs/config.yaml. A family a sweep file picks is checked by `check_speculator`.
    """
    def families(choice_key: str, default: list[str]) -> list[str]:
        values = [a.split("=", 1)[1] for a in overrides if a.lstrip("+").startswith(choice_key + "=")]
        return values[-1].split(",") if values else default

    parts = {"speculator": families("speculator", ["mlp"]),
             "speculator.learned": families("speculator@speculator.learned", ["mlp"])}
    for arg in overrides:
        key, sep, value = arg.lstrip("+~").partition("=")
        where, _, option = key.rpartition(".")
        if not sep or where not in parts:
            continue
        for family in parts[where]:  # a renamed key first: its message is the more useful
            try:
                check_renamed(family, {option: value}, where)
            except ValueError as exc:
                raise ConfigRangeError(f"invalid config: {exc}") from None
        for family in parts[where]:
            names = option_names(family)
            if names is not None and option not in names | {"family"}:
                raise ConfigRangeError(f"invalid config: unknown {family} speculator option {where}.{option}; "
                                       f"valid: {sorted(names)}")
