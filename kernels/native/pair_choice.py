"""Which bf16 GEMM path decoding and verification take on this machine: the probe and the rule.

decoder.c multiplies bf16 weights one of three ways (ops.BF16_PATHS): widened to fp32 and
multiplied with fp32 FMAs (every build); as bf16 pairs with vdpbf16ps, the input rows
rounded to bf16 (AVX512-BF16); or as the same pairs on AMX tiles (Intel Sapphire Rapids and
later; by the override only, see CANDIDATES). A flag cannot say which is fastest: that is
the instructions' issue rates. An AVX512-BF16 Xeon (lscpu model 207) issues vdpbf16ps at 0.5
per cycle and fp32 FMAs at 2, so widening does twice the products per cycle there and won at
every pass width (docs/archive/results-history.md).

The paths give slightly different numbers (bf16-rounded or full fp32 inputs, and different
summation orders). Each is batch-invariant, so decoding is lossless on any of them, but the
choice is measured once per machine and kernel build, by the machine profile's measuring
step (speclab.speculator.target.measure), and recorded in the profile, so that every process
on a machine computes the same bits; NativeOps takes it as an argument.
SPECLAB_BF16_PATH=widened, pairs or amx overrides it.
"""

from __future__ import annotations

import os

import torch

from ..util.timing import alternated_ms
from .bf16 import BF16_PATHS, bf16_paths
from .ops import NativeOps

# A 9-token verification and a 1-token step through SmolLM2's MLP up-projection, over
# COPIES distinct copies of its weights (3.5 MB each in bf16, 57 MB in all) so that, as in a
# real pass, they stream from memory: with one copy in cache the AMX tiles' 1-row step
# looked 1.6x slower than vdpbf16ps's, while in SmolLM2's passes the two tie at one token.
PROBE_ROWS, PROBE_OUT, PROBE_IN, COPIES = (1, 9), 3072, 576, 16
ROUNDS, CALLS = 7, 2
OVERRIDE = "SPECLAB_BF16_PATH"
# The paths chosen among automatically. AMX tiles only by the override: on an AMX Xeon they
# made a 9-token pass 1.15-1.4x cheaper but a 1-token step 5-9% dearer (tile loads stream the
# weights more slowly than vector loads), and speculative decoding's tok/s came out the same
# (suffix drafts are mostly 2-4 tokens) while plain decoding lost those 5-9%: a speedup that
# only a slower baseline buys. Their gain goes to the wide passes instead (wide_gemm.py).
CANDIDATES = ("widened", "pairs")


def forced_path() -> str | None:
    """The path SPECLAB_BF16_PATH names, or None (NativeOps refuses one a build lacks,
    naming those it has)."""
    forced = os.environ.get(OVERRIDE)
    if forced is not None and forced not in BF16_PATHS:
        raise ValueError(f"{OVERRIDE} must be one of {', '.join(BF16_PATHS)}; got {forced!r}")
    return forced


def candidates(lib) -> list[str]:
    """The paths this build has that are chosen among by measuring."""
    return [p for p in bf16_paths(lib) if p in CANDIDATES]


def choose(ms: dict[str, float]) -> str:
    """The path whose probe ran fastest."""
    return min(ms, key=ms.get)


def time_paths(lib) -> dict[str, float]:
    """Median ms of the probe (a 1-row and a 9-row GEMM over each copy of the weights) on
    each path this machine has, the paths alternated so that a burst of load hits them all."""
    g = torch.Generator().manual_seed(0)
    weights = [(torch.randn(PROBE_OUT, PROBE_IN, generator=g) * 0.02).to(torch.bfloat16) for _ in range(COPIES)]
    xs = [torch.randn(rows, PROBE_IN, generator=g) for rows in PROBE_ROWS]
    paths = {name: NativeOps(lib, bf16_path=name) for name in candidates(lib)}
    packed = {name: [ops.pack(w) for w in weights] for name, ops in paths.items()}

    def probe(name: str):
        ops = paths[name]
        return lambda: [ops.linear(x, w) for x in xs for w in packed[name]]

    return alternated_ms({name: probe(name) for name in paths}, ROUNDS, CALLS, warm=False)
