"""The machine profile: every choice that depends on the machine, as data.

Four choices depend on timing this machine, not on a flag (a flag says what the hardware
could do, not what the software stack makes of it):

- the bf16 GEMM path of the native kernels (runtime/pair_choice.py), per kernel build;
- the wide passes' GEMM engine and the widths it starts from (runtime/wide_gemm.py), per
  kernel build and the bf16 path it was measured against;
- `dtype: auto`, the dtype a target decodes fastest in (dtype_choice.py), per target;
- a target's verification-cost curve (ms to verify n tokens, eval/method.py), per target,
  dtype and runtime.

`MachineProfile` holds them. It is measured in one explicit step (measure.py's
`measure_profile`: `speclab doctor --measure`, or the setup step of a run, eval or bench
where no record holds a choice it needs) and recorded as one JSON record per machine,
software versions and kernel build (machine_records.py); a target's choices sit in that
record under the target's fingerprint. Constructors (NativeOps, the lean decoder, the
target builders) read the choices as data and never time anything; where no record holds
one they take the choice that needs no measurement (bf16 weights widened, no wide engine,
fp32) and say so in one line. A record is parsed against the schema below, field by field;
one that does not parse is refused with one line and measured again by the next step.

SPECLAB_BF16_PATH and SPECLAB_WIDE_GEMM override the recorded kernel choices (ops.py,
wide_gemm.py); an override is never recorded.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field, replace

import torch

from speclab.kernels.util import machine_records
from speclab.kernels import native
from speclab.kernels.native import pair_choice, wide_gemm
from speclab.kernels.native.bf16 import bf16_paths
from speclab.kernels.native.wide_gemm import WideChoice

log = logging.getLogger(__name__)
RECORDS = "machine-profile"  # the speclab cache folder of the records (machine_records.py)
SCHEMA = 1  # bump when the record's fields change: an older record then does not parse
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}  # the dtypes `auto` chooses among
_warned: set[str] = set()  # one line per process for each choice taken without a record
# Profiles this process measured, by build: what it reads where its record could not be
# written (a read-only cache costs a measurement per process, not the choice).
_measured: dict[str, "MachineProfile"] = {}


class ProfileError(ValueError):
    """A record that does not follow the schema."""


@dataclass(frozen=True)
class Bf16Path:
    """The bf16 GEMM path (ops.BF16_PATHS) and the probe's median ms per candidate path
    (empty where the build has one path only: nothing to time)."""

    path: str
    probe_ms: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class WideEngine:
    """The wide passes' choice measured against one bf16 path: its engine, from how many rows
    the head and the layers take it, and the probe's median ms per engine and width."""

    engine: str
    head_rows: int | None
    layer_rows: int | None
    probe_ms: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def choice(self) -> WideChoice:
        return WideChoice(self.head_rows, self.layer_rows, self.engine)


@dataclass(frozen=True)
class DtypeChoice:
    """`dtype: auto` for one runtime: the faster dtype and each one's decode-step ms."""

    fastest: str
    decode_step_ms: dict[str, float]


@dataclass(frozen=True)
class TargetProfile:
    """A target's choices: dtype per requested runtime (`lean/auto`, `hf/auto`...), and its
    verification-cost curves per key (verify_cost_key: dtype, runtime, lengths, repeats)."""

    name: str
    dtype: dict[str, DtypeChoice] = field(default_factory=dict)
    verify_cost_ms: dict[str, dict[int, float]] = field(default_factory=dict)


@dataclass(frozen=True)
class MachineProfile:
    """This machine's measured choices for one kernel build (module docstring)."""

    machine: str
    cpu_flags: tuple[str, ...]
    build: str  # native.lib_build of the kernels measured, "none" without them
    bf16: Bf16Path | None = None
    wide: dict[str, WideEngine] = field(default_factory=dict)  # bf16 path measured against -> choice
    targets: dict[str, TargetProfile] = field(default_factory=dict)  # target_fingerprint -> choices

    def to_json(self) -> dict:
        return {
            "schema": SCHEMA, "machine": self.machine, "cpu_flags": list(self.cpu_flags), "build": self.build,
            "bf16": None if self.bf16 is None else {"path": self.bf16.path, "probe_ms": self.bf16.probe_ms},
            "wide": {path: {"engine": w.engine, "head_rows": w.head_rows, "layer_rows": w.layer_rows,
                            "probe_ms": w.probe_ms} for path, w in self.wide.items()},
            "targets": {fp: {"name": t.name,
                             "dtype": {k: {"fastest": d.fastest, "decode_step_ms": d.decode_step_ms}
                                       for k, d in t.dtype.items()},
                             "verify_cost_ms": {k: {str(n): ms for n, ms in c.items()}
                                                for k, c in t.verify_cost_ms.items()}}
                        for fp, t in self.targets.items()},
        }

    @classmethod
    def from_json(cls, data) -> MachineProfile:
        """The profile a record holds, each field checked; ProfileError names the first that
        does not fit. Nothing in the record is imported or evaluated."""
        data = _object(data, "record")
        if data.get("schema") != SCHEMA:
            raise ProfileError(f"schema {data.get('schema')!r}, this version reads {SCHEMA}")
        flags = data.get("cpu_flags")
        if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags):
            raise ProfileError("cpu_flags must be a list of strings")
        bf16 = data.get("bf16")
        if bf16 is not None:
            bf16 = _object(bf16, "bf16")
            bf16 = Bf16Path(_choice(bf16.get("path"), pair_choice.BF16_PATHS, "bf16.path"),
                            _ms(bf16.get("probe_ms", {}), "bf16.probe_ms"))
        wide = {_choice(path, pair_choice.BF16_PATHS, "wide path"): _wide(w, f"wide.{path}")
                for path, w in _object(data.get("wide", {}), "wide").items()}
        targets = {fp: _target(t, f"targets.{fp}") for fp, t in _object(data.get("targets", {}), "targets").items()}
        return cls(_string(data.get("machine"), "machine"), tuple(flags), _string(data.get("build"), "build"),
                   bf16, wide, targets)

    def target(self, fingerprint: str) -> TargetProfile | None:
        return self.targets.get(fingerprint)

    def with_target(self, fingerprint: str, target: TargetProfile) -> MachineProfile:
        return replace(self, targets={**self.targets, fingerprint: target})


def _object(value, where: str) -> dict:
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise ProfileError(f"{where} must be an object")
    return value


def _string(value, where: str) -> str:
    if not isinstance(value, str):
        raise ProfileError(f"{where} must be a string, got {value!r}")
    return value


def _choice(value, valid, where: str) -> str:
    if value not in valid:
        raise ProfileError(f"{where}={value!r}, valid: {', '.join(valid)}")
    return value


def _number(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ProfileError(f"{where}={value!r} is not a time in ms")
    return float(value)


def _ms(value, where: str) -> dict[str, float]:
    return {k: _number(v, f"{where}.{k}") for k, v in _object(value, where).items()}


def _rows(value, where: str) -> int | None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ProfileError(f"{where}={value!r}")
    return value


def _wide(value, where: str) -> WideEngine:
    value = _object(value, where)
    return WideEngine(_choice(value.get("engine"), wide_gemm.ENGINES, f"{where}.engine"),
                      _rows(value.get("head_rows"), f"{where}.head_rows"),
                      _rows(value.get("layer_rows"), f"{where}.layer_rows"),
                      {k: _ms(v, f"{where}.probe_ms.{k}") for k, v in _object(value.get("probe_ms", {}),
                                                                               f"{where}.probe_ms").items()})


def _target(value, where: str) -> TargetProfile:
    value = _object(value, where)
    dtype = {}
    for key, d in _object(value.get("dtype", {}), f"{where}.dtype").items():
        d = _object(d, f"{where}.dtype.{key}")
        dtype[key] = DtypeChoice(_choice(d.get("fastest"), tuple(DTYPES), f"{where}.dtype.{key}.fastest"),
                                 _ms(d.get("decode_step_ms", {}), f"{where}.dtype.{key}.decode_step_ms"))
    costs = {}
    for key, curve in _object(value.get("verify_cost_ms", {}), f"{where}.verify_cost_ms").items():
        curve = _ms(curve, f"{where}.verify_cost_ms.{key}")
        if not curve or not all(n.isdigit() and int(n) > 0 for n in curve):
            raise ProfileError(f"{where}.verify_cost_ms.{key} must map token counts to ms")
        costs[key] = {int(n): ms for n, ms in curve.items()}
    return TargetProfile(_string(value.get("name"), f"{where}.name"), dtype, costs)


# --- where a profile is recorded -------------------------------------------------------


def build_of(lib) -> str:
    """The kernel build a profile is keyed by: the library's (native.lib_build), or this
    machine's default build where none is given ("none" without a C compiler)."""
    return native.lib_build(lib) if lib is not None else native.build_id()


def record_key(lib=None) -> list:
    """The record's key beside the machine's own (machine_records adds the CPU, its flags,
    the thread count, the versions and this machine's default build)."""
    return [SCHEMA, build_of(lib)]


def empty_profile(lib=None) -> MachineProfile:
    model, flags = native.cpu_info()
    return MachineProfile(machine_records.machine_name() or model, tuple(flags), build_of(lib))


def recorded_profile(lib=None) -> MachineProfile | None:
    """The profile recorded for this machine and kernel build (lib: the kernels' library,
    None for the default build), or None: absent, or refused in one line where it does not
    parse or names another machine or build."""
    raw = machine_records.read(RECORDS, record_key(lib))
    if raw is None:
        return None
    try:
        profile = MachineProfile.from_json(raw)
        if profile.build != build_of(lib):
            raise ProfileError(f"it names build {profile.build}, not {build_of(lib)}")
    except ProfileError as exc:
        log.warning("refusing the machine profile record (%s): the next measuring step measures it again", exc)
        return None
    return profile


def remember(profile: MachineProfile, lib=None) -> None:
    """Record the profile (merged with targets another process recorded meanwhile); this
    process reads it from now on even where the record cannot be written."""
    current = recorded_profile(lib)
    if current is not None:
        profile = replace(profile, targets={**current.targets, **profile.targets})
    _measured[build_of(lib)] = profile
    machine_records.remember(RECORDS, record_key(lib), profile.to_json(), "the machine profile")


def current_profile(lib=None) -> MachineProfile | None:
    """The recorded profile, else the one this process measured, else None."""
    return recorded_profile(lib) or _measured.get(build_of(lib))


# --- the choices the runtime reads ---------------------------------------------------------


@dataclass(frozen=True)
class KernelChoices:
    """What a lean decoder on the native kernels is built with."""

    bf16_path: str = "widened"
    wide: WideChoice = WideChoice()


def kernel_choices(lib, profile: MachineProfile | None = None, bf16_path: str | None = None) -> KernelChoices:
    """The bf16 path and wide-pass choice for `lib` (bf16_path: fixed by the caller): the
    override, else the build's only path, else the profile (default: the recorded one), else
    the choice that needs no measurement. Reads; never times."""
    if profile is None:
        profile = current_profile(lib)
    path = bf16_path or pair_choice.forced_path()
    if path is None:
        available = pair_choice.candidates(lib)
        if len(available) == 1:
            path = available[0]
        elif profile is not None and profile.bf16 is not None and profile.bf16.path in available:
            path = profile.bf16.path
        else:
            path = "widened"
            _say_once(lib, "bf16 weights are widened to fp32")
    wide = wide_gemm.forced_choice(lib)
    if wide is None:
        entry = profile.wide.get(path) if profile is not None else None
        if entry is not None and wide_gemm.record_problem(lib, entry.engine, entry.probe_ms) is None:
            wide = entry.choice
        else:
            wide = WideChoice()
            _say_once(lib, "wide passes keep the decoding GEMM")
    return KernelChoices(path, wide)


def _say_once(lib, taken: str) -> None:
    key = f"{build_of(lib)}: {taken}"
    if key not in _warned:
        _warned.add(key)
        log.warning("no measured machine profile for kernel build %s: %s (`speclab doctor --measure` measures it)",
                    build_of(lib), taken)


def target_fingerprint(model, name: str, device: str) -> str:
    """What a target's choices are keyed by: its name, architecture and size (the model's
    config, its dtype fields left out: `auto` is chosen for the model whatever it was loaded
    in) and the device."""
    config = {k: v for k, v in model.config.to_dict().items() if k not in ("torch_dtype", "dtype")}
    key = json.dumps([name, config, str(device)], sort_keys=True, default=str)
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def auto_dtype(model, name: str, runtime: str, lean_backend: str, device: str,
               profile: MachineProfile | None = None) -> tuple[torch.dtype, dict]:
    """(dtype, how it was chosen) for `dtype: auto`: CUDA takes bf16; a CPU the recorded
    choice, or fp32 where none is recorded (said in one line)."""
    if str(device).startswith("cuda"):
        return torch.bfloat16, {"requested": "auto", "source": "cuda default"}
    profile = profile or current_profile()
    target = profile.target(target_fingerprint(model, name, device)) if profile is not None else None
    choice = target.dtype.get(f"{runtime}/{lean_backend}") if target is not None else None
    if choice is None:
        log.warning("dtype auto: no measured choice for %s (%s/%s) on this machine: fp32 (a run's setup step, "
                    "or `speclab doctor --measure`, measures it)", name, runtime, lean_backend)
        return torch.float32, {"requested": "auto", "source": "no machine profile: fp32"}
    return DTYPES[choice.fastest], {"requested": "auto", "fastest": choice.fastest,
                                    "decode_step_ms": choice.decode_step_ms, "machine": profile.machine,
                                    "source": "machine profile"}


def verify_cost_key(dtype: torch.dtype, runtime: str, lengths: list[int], repeats: int, context: int) -> str:
    """A curve's key within its target: what changes the timing besides the target."""
    return json.dumps([str(dtype).removeprefix("torch."), runtime, sorted(set(lengths)), repeats, context])
