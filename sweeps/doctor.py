"""`speclab doctor`: this machine as the runtime sees it, and the setup step that measures it.

    speclab doctor [--measure] [--json] [--target NAME]

prints the machine, its CPU's SIMD flags, the native kernels' build, and each choice of
the machine profile (speclab.speculator.target.profile) with its probe timings: the bf16
GEMM path, the wide passes' engine and widths, and each recorded target's `dtype: auto`
and verification-cost curves. `--measure` measures the kernel choices again (and, with
`--target NAME`, that configs/target/NAME.yaml target's dtype) and records them.

`prepare_machine` is the setup step of a run, `speclab eval` and `speclab bench`: before
the target is built it measures the choices that target needs where no record holds them,
so that no constructor ever times the machine.
"""

from __future__ import annotations

import argparse
import json
import os

from .errors import CliError, user_errors

# The CPU flags that decide which kernels a build has (kernels/native/lean.h), in the order they extend.
SIMD_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "amx_tile", "amx_bf16")


def add_parser(commands) -> argparse.ArgumentParser:
    doctor = commands.add_parser("doctor", help="this machine's profile: CPU, kernel build, measured choices")
    doctor.add_argument("--measure", action="store_true", help="measure the choices again and record them")
    doctor.add_argument("--json", action="store_true", help="print the profile as JSON")
    doctor.add_argument("--target", metavar="NAME",
                        help="with --measure: also measure configs/target/NAME.yaml's dtype: auto")
    return doctor


def cmd_doctor(args: argparse.Namespace) -> int:
    from speclab.kernels import native
    from speclab.speculator.target.measure import measure_profile
    from speclab.speculator.target.profile import empty_profile, recorded_profile

    if args.target and not args.measure:
        raise CliError("--target is measured: give --measure with it")
    lib = native.load()
    if args.measure:  # a target's setup measures the kernel choices too, where it reads them
        with user_errors():  # a target config that does not build says why in one line
            profile = args.target and prepare_machine(target_config(args.target), remeasure=True)
        profile = profile or measure_profile(lib, remeasure=True)
    else:
        profile = recorded_profile(lib) or empty_profile(lib)
    if args.json:
        print(json.dumps(profile.to_json(), indent=2))
    else:
        print(format_profile(profile, lib is not None, recorded=args.measure or recorded_profile(lib) is not None))
    return 0


def format_profile(profile, kernels_built: bool, recorded: bool = True) -> str:
    """The profile as the lines `speclab doctor` prints (overrides named where set)."""
    flags = [f for f in SIMD_FLAGS if f in profile.cpu_flags]
    lines = [f"machine        {profile.machine}",
             f"cpu flags      {' '.join(flags) or 'none of ' + ' '.join(SIMD_FLAGS)}",
             f"kernel build   {profile.build}" + ("" if kernels_built else " (no C compiler: the torch path runs)")]
    if not recorded:
        lines.append("profile        not measured yet (speclab doctor --measure, or a run's setup step)")
    for env in ("SPECLAB_BF16_PATH", "SPECLAB_WIDE_GEMM", "SPECLAB_NATIVE_MARCH"):
        if env in os.environ:
            lines.append(f"override       {env}={os.environ[env]}")
    if profile.bf16 is not None:
        lines.append(f"bf16 path      {profile.bf16.path}  probe ms {_ms(profile.bf16.probe_ms) or '(the only path)'}")
    for path, wide in sorted(profile.wide.items()):
        lines.append(f"wide engine    {wide.engine} against {path}: head from {_rows(wide.head_rows)}, "
                     f"layers from {_rows(wide.layer_rows)} rows")
        for engine, ms in sorted(wide.probe_ms.items()):
            lines.append(f"  probe ms     {engine}: {_ms(ms)}")
    for fingerprint, target in sorted(profile.targets.items()):
        lines.append(f"target         {target.name} ({fingerprint})")
        for runtime, choice in sorted(target.dtype.items()):
            lines.append(f"  dtype auto   {runtime}: {choice.fastest}  decode step ms {_ms(choice.decode_step_ms)}")
        for key, curve in sorted(target.verify_cost_ms.items()):
            dtype, runtime = json.loads(key)[:2]
            lines.append(f"  verify cost  {dtype} {runtime}: "
                         + ", ".join(f"{n}: {ms:.3g}" for n, ms in sorted(curve.items())) + " ms")
    return "\n".join(lines)


def _ms(ms: dict) -> str:
    return ", ".join(f"{k}: {v:.3g}" for k, v in ms.items())


def _rows(rows: int | None) -> str:
    return "never" if rows is None else str(rows)


def target_config(name: str) -> dict:
    """configs/target/NAME.yaml as plain data (validated when built)."""
    from importlib.resources import files

    from omegaconf import OmegaConf

    path = files("speclab.configs").joinpath("target", f"{name}.yaml")
    if not path.is_file():
        raise CliError(f"no target config {name!r} (configs/target/{name}.yaml)")
    return OmegaConf.to_container(OmegaConf.load(str(path)), resolve=True)


def prepare_machine(target: dict, remeasure: bool = False):
    """The setup step for a target config (`_target_` and the builder's arguments, validated
    as plain data): measure.prepare_for with its builder."""
    from speclab.speculator.target.measure import prepare_for

    from .target_spec import builders, parse_target_spec

    spec = parse_target_spec(target)
    return prepare_for(builders()[spec.builder], spec.kwargs, remeasure)
