"""Wide passes (a prompt's prefill, batched generation) on a faster GEMM where one pays.

decoder.c's GEMM on the decoding path (ops.py: fp32 FMAs or vdpbf16ps) streams weights once
per pass and runs at the CPU's FMA peak once a pass has more than a few rows; that is the
right kernel for decoding and verification (1..30 rows, bandwidth-bound). A 130-token
prefill or a 32-row generation step is compute-bound instead, and CPUs with AMX tiles
(Intel Sapphire Rapids and later) multiply bf16 several times faster there. Two engines use
them: decoder.c's own tile GEMM (`amx`: the whole layer stack in one call, as decoding runs
it) and torch's bf16 GEMM (`torch`, oneDNN: a Python call per linear). Elsewhere both are
slower than the decoding path, so whether, on which engine and from how many rows is
measured once per machine and kernel build by the machine profile's measuring step
(speclab.speculator.target.measure, with `time_paths` and `choose` below), recorded in the
profile, and handed to the decoder as data, like pair_choice.py's choice.

A wide engine's rows are not bit-for-bit what the decoding path computes (inputs rounded to
bf16, another summation order), so a pass uses it only when its caller allows
(`invariant=False`): a request's prefill, the same pass in plain and speculative decoding,
and batched self-distillation. Verification never does: speculative decoding's output
equals plain decoding's because its verification rows equal 1-row passes (ops.py).
SPECLAB_WIDE_GEMM=0 turns it off; SPECLAB_WIDE_GEMM=<rows> forces it from that many rows
(on AMX tiles where the CPU has them, else torch's GEMM).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..util.timing import alternated_ms
from .ops import NativeOps

# SmolLM2's MLP up-projection (gate and up fused) at the widths the choice can start from.
PROBE_ROWS, PROBE_OUT, PROBE_IN = (16, 32, 64, 128), 3072, 576
ROUNDS, CALLS = 5, 4
# How much faster than the decoding path's GEMM a wide engine must be at a width to be used
# from it. The LM head is one call either way: a clear win (a probe is short, a machine
# noisy). torch's layers are ~8 calls per layer against one native call for the whole
# stack, so its GEMMs must save more than that Python cost: on an AMX Xeon, SmolLM2's
# 32-token prefill was 11% slower on torch although the probe's GEMM was 1.5x faster, and 64
# tokens 1.3x faster (docs/archive/results-history.md). The AMX engine's layers are one call, as the head.
HEAD_MARGIN, LAYER_MARGIN = 0.8, 0.6
ENGINES = ("amx", "torch")


@dataclass(frozen=True)
class WideChoice:
    """From how many rows a pass that allows it (`invariant=False`) runs on the wide engine:
    its LM head, its layers; None: never. engine: `amx` (decoder.c's tiles) or `torch`."""

    head_rows: int | None = None
    layer_rows: int | None = None
    engine: str = "torch"

    @property
    def used(self) -> bool:
        return self.head_rows is not None or self.layer_rows is not None


class WideLinear:
    """A linear layer's weight [N, K] in bf16 for torch's GEMM, beside its native packing."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        self.weight = weight.detach().to(torch.bfloat16).contiguous()
        self.bias = None if bias is None else bias.detach().float()

    def __call__(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """x [M, K] fp32 -> x @ W^T [M, N] fp32; with `out`, adds into it in place."""
        y = F.linear(x.to(torch.bfloat16), self.weight).float()
        if self.bias is not None:
            y += self.bias
        if out is None:
            return y
        return out.add_(y)


def forced_choice(lib) -> WideChoice | None:
    """The choice SPECLAB_WIDE_GEMM forces (0: never; a row count: from that many rows, on
    AMX tiles where the build has them, else torch's GEMM), or None."""
    forced = os.environ.get("SPECLAB_WIDE_GEMM")
    if forced is None:
        return None
    if not forced.isdigit():
        raise ValueError(f"SPECLAB_WIDE_GEMM must be 0 (off) or a row count, got {forced!r}")
    if not int(forced):
        return WideChoice()
    return WideChoice(int(forced), int(forced), "amx" if _has_amx(lib) else "torch")


def _has_amx(lib) -> bool:
    return bool(getattr(lib, "lean_amx", lambda: 0)())


def record_problem(lib, engine: str, probe_ms: dict) -> str | None:
    """Why a recorded choice does not fit `lib` (None where it does): an AMX engine on a build
    without the tiles, or a choice that never probed this build's AMX engine. The record is
    keyed by the build, so the second is a process of the same build that could not use the
    tiles (the kernel asks Linux for them): it must not keep an AMX machine on torch's GEMM
    (739-759 tok/s of batched generation against 1072-1105, docs/archive/results-history.md)."""
    if engine == "amx" and not _has_amx(lib):
        return "names the AMX engine, which this build lacks"
    if _has_amx(lib) and "amx" not in (probe_ms or {}):
        return "did not probe this build's AMX engine"
    return None


def choose(ms: dict[str, dict[str, float]]) -> WideChoice:
    """The engine faster at the widest probe, from the first width where it clearly beats the
    decoding path (HEAD_MARGIN, LAYER_MARGIN)."""
    engines = [e for e in ENGINES if e in ms]
    widest = str(max(PROBE_ROWS))
    engine = min(engines, key=lambda e: ms[e][widest])
    layer_margin = HEAD_MARGIN if engine == "amx" else LAYER_MARGIN

    def first_win(margin: float) -> int | None:
        return next((r for r in PROBE_ROWS if ms[engine][str(r)] < margin * ms["native"][str(r)]), None)

    return WideChoice(first_win(HEAD_MARGIN), first_win(layer_margin), engine)


def time_paths(lib, bf16_path: str) -> dict[str, dict[str, float]]:
    """Median ms per probe width on the decoding path (`native`, its GEMM on bf16_path) and
    each engine this machine has, the paths alternated so that a burst of load hits all."""
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(PROBE_OUT, PROBE_IN, generator=g) * 0.02).to(torch.bfloat16)
    ops = NativeOps(lib, bf16_path=bf16_path)
    packed, wide = ops.pack(w), WideLinear(w, None)
    paths = {"native": lambda x: ops.linear(x, packed), "torch": wide}
    if _has_amx(lib):
        amx = NativeOps(lib, bf16_path="amx")
        amx_packed = amx.pack(w)
        paths["amx"] = lambda x: amx.linear(x, amx_packed)
    xs = {r: torch.randn(r, PROBE_IN, generator=g) for r in PROBE_ROWS}
    per_width = {r: alternated_ms({name: (lambda run=run, x=x: run(x)) for name, run in paths.items()}, ROUNDS, CALLS)
                 for r, x in xs.items()}
    return {name: {str(r): per_width[r][name] for r in PROBE_ROWS} for name in paths}
