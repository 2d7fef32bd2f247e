"""The machine profile's measuring step: the one place that times this machine.

`measure_profile` measures what the record for this machine and kernel build lacks (or
everything, `remeasure`), records it, and returns the profile: the bf16 GEMM path
(pair_choice.py's probe), the wide passes' engine against that path (wide_gemm.py's probe),
and, given a target's model, its `dtype: auto` (dtype_choice.py). A target's
verification-cost curve is measured by `verify_cost` on the built target (eval's method
step asks for it). `speclab doctor --measure` and the setup step of a run, `speclab eval`
and `speclab bench` call these before anything is built; constructors only read the result
(profile.py).
"""

from __future__ import annotations

import inspect
import logging
import statistics
import time
from dataclasses import replace
from typing import Callable

import torch

from . import dtype_choice
from speclab.kernels import native
from speclab.kernels.native import pair_choice, wide_gemm
from .frozen import FrozenTarget
from speclab.speculator.target.profile import (Bf16Path, DtypeChoice, MachineProfile, TargetProfile, WideEngine,
                                               current_profile, empty_profile, recorded_profile, remember, target_fingerprint,
                                               verify_cost_key)

log = logging.getLogger(__name__)
_DEFAULT = object()  # lib not given: this machine's default build (native.load)
KERNEL_DTYPES = ("auto", "bf16", "bfloat16")  # target dtypes whose decoding reads the kernel choices


def prepare_for(builder: Callable[..., FrozenTarget], kwargs: dict, remeasure: bool = False) -> MachineProfile | None:
    """The setup step of whatever builds `builder(**kwargs)` (a run, `speclab eval`, `speclab
    bench`): the profile that build reads, measured where no record holds it; None where
    it reads none. The kernel choices are measured for a bf16 or `auto` target on the native
    kernels; `dtype: auto` on a CPU builds the target once in fp32 to time its decode step."""
    args = {name: p.default for name, p in inspect.signature(builder).parameters.items()
            if p.default is not inspect.Parameter.empty}
    args.update(kwargs)
    device, runtime, backend = str(args.get("device", "cpu")), args.get("runtime", "lean"), args.get("lean_backend", "auto")
    cpu = not device.startswith("cuda")
    kernels = cpu and runtime == "lean" and backend != "torch" and args.get("dtype") in KERNEL_DTYPES
    dtype = cpu and args.get("dtype") == "auto"
    if not (kernels or dtype):
        return None
    lib = native.load() if kernels else None  # None: the kernel choices are left as recorded
    if not dtype:
        return measure_profile(lib, remeasure=remeasure)
    fp32 = builder(**{**kwargs, "dtype": "fp32"})
    return measure_profile(lib, model=fp32.model, name=fp32.name, runtime=runtime, lean_backend=backend,
                           device=device, remeasure=remeasure)


def measure_profile(lib=_DEFAULT, *, bf16_path: str | None = None, model=None, name: str | None = None,
                    runtime: str = "lean", lean_backend: str = "auto", device: str = "cpu",
                    remeasure: bool = False) -> MachineProfile:
    """The profile of this machine for `lib` (default: this machine's build of the native
    kernels; None: no kernels), its missing choices measured and recorded. bf16_path: the
    path the wide engines are measured against, fixed by the caller (else the override, the
    record's or a measurement). model, name, runtime, lean_backend, device: a target whose
    `dtype: auto` is measured too (any dtype; CUDA needs no measurement)."""
    lib = native.load() if lib is _DEFAULT else lib
    before = None if remeasure else recorded_profile(lib)
    profile = before or empty_profile(lib)
    if lib is not None:
        profile, path = _bf16(profile, lib, bf16_path, remeasure)
        profile = _wide(profile, lib, path, remeasure)
    if profile != before:  # the dtype's timing reads the kernel choices: recorded first
        remember(profile, lib)
    if model is not None and not str(device).startswith("cuda"):
        measured = _dtype(profile, model, name, runtime, lean_backend, device, remeasure)
        if measured is not profile:
            profile = measured
            remember(profile, lib)
    return profile


def _bf16(profile: MachineProfile, lib, fixed: str | None, remeasure: bool) -> tuple[MachineProfile, str]:
    """(profile, the bf16 path the wide engines are measured against)."""
    forced = fixed or pair_choice.forced_path()
    if forced is not None:  # an override is used, never recorded
        return profile, forced
    available = pair_choice.candidates(lib)
    if len(available) == 1:
        return replace(profile, bf16=Bf16Path(available[0])), available[0]
    recorded = profile.bf16
    if not remeasure and recorded is not None:
        if recorded.path in available and sorted(recorded.probe_ms) == sorted(available):
            return profile, recorded.path
        log.warning("the recorded bf16 GEMM path (%s among %s) does not fit this build's %s: measuring again",
                    recorded.path, sorted(recorded.probe_ms), available)
    ms = pair_choice.time_paths(lib)
    path = pair_choice.choose(ms)
    log.info("bf16 GEMMs: %s (probe ms %s)", path, ms)
    return replace(profile, bf16=Bf16Path(path, ms)), path


def _wide(profile: MachineProfile, lib, path: str, remeasure: bool) -> MachineProfile:
    if wide_gemm.forced_choice(lib) is not None:
        return profile
    recorded = profile.wide.get(path)
    if not remeasure and recorded is not None:
        problem = wide_gemm.record_problem(lib, recorded.engine, recorded.probe_ms)
        if problem is None:
            return profile
        log.warning("the recorded wide-GEMM choice %s: measuring again", problem)
    ms = wide_gemm.time_paths(lib, path)
    choice = wide_gemm.choose(ms)
    log.info("wide passes: %s (probe ms %s)", choice, ms)
    engine = WideEngine(choice.engine, choice.head_rows, choice.layer_rows, ms)
    return replace(profile, wide={**profile.wide, path: engine})


def _dtype(profile: MachineProfile, model, name: str, runtime: str, lean_backend: str, device: str,
           remeasure: bool) -> MachineProfile:
    fingerprint, key = target_fingerprint(model, name, device), f"{runtime}/{lean_backend}"
    target = profile.target(fingerprint) or TargetProfile(name)
    if key in target.dtype and not remeasure:
        return profile
    ms = dtype_choice.time_dtypes(model, name, runtime, lean_backend, profile)
    fastest = min(ms, key=ms.get)
    log.info("dtype auto for %s: %s (decode step ms %s)", name, fastest, ms)
    target = replace(target, dtype={**target.dtype, key: DtypeChoice(fastest, ms)})
    return profile.with_target(fingerprint, target)


@torch.no_grad()
def verification_cost(target: FrozenTarget, prompt: torch.Tensor, lengths: list[int], repeats: int) -> dict[int, float]:
    """{n: median ms to verify n tokens after prompt [1, T]}, each as a chain-shaped tree."""
    # The measuring context is the prompt's, cut to leave room for the longest pass.
    prompt = prompt[:, -(target.context_length - max(lengths)):]
    cache = target.new_cache(max_len=prompt.shape[1] + max(lengths))
    target(prompt.to(target.device), cache, logits_for="last")
    past, out = prompt.shape[1], {}
    for n in sorted(set(lengths)):
        ids = prompt[:, -1:].to(target.device).repeat(1, n)  # [1, n]: the tokens do not change the cost
        mask = target.tree_mask(torch.ones(n, n, dtype=torch.bool).tril(), past)
        positions = past + torch.arange(n, device=target.device)[None]  # [1, n]
        times = []
        for attempt in range(repeats + 1):  # the first call of a shape is a warm-up
            start = time.perf_counter()
            target(ids, cache, logits_for="all", attention_mask=mask, position_ids=positions)
            if target.device.type == "cuda":
                torch.cuda.synchronize(target.device)
            if attempt:
                times.append((time.perf_counter() - start) * 1e3)
            FrozenTarget.rollback(cache, n)
        out[n] = statistics.median(times)
    return out


def recorded_verify_cost(target: FrozenTarget, lengths: list[int], repeats: int, context: int) -> dict[int, float] | None:
    """The curve the profile records for this target, dtype, runtime and measurement, or None."""
    profile = current_profile()
    entry = profile.target(target_fingerprint(target.model, target.name, target.device)) if profile else None
    if entry is None:
        return None
    return entry.verify_cost_ms.get(verify_cost_key(target.dtype, target.runtime, lengths, repeats, context))


def verify_cost(target: FrozenTarget, context: torch.Tensor, lengths: list[int], repeats: int) -> dict[int, float]:
    """Measure the target's verification-cost curve after `context` [1, T] and record it in
    the profile of this machine's default build (the target's fingerprint, its dtype and
    runtime, the lengths, repeats and context length key it)."""
    cost = verification_cost(target, context, lengths, repeats)
    profile = current_profile() or empty_profile()
    fingerprint = target_fingerprint(target.model, target.name, target.device)
    entry = profile.target(fingerprint) or TargetProfile(target.name)
    key = verify_cost_key(target.dtype, target.runtime, lengths, repeats, context.shape[1])
    entry = replace(entry, verify_cost_ms={**entry.verify_cost_ms, key: dict(cost)})
    remember(profile.with_target(fingerprint, entry))
    return cost
