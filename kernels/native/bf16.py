"""The ways a build of the native library can multiply bf16 weights, in a module of its own
so that ops.py (which packs for a path) and pair_choice.py (which picks one) both import it
and neither imports the other for it."""

from __future__ import annotations

# How bf16 weights can be multiplied: widened to fp32 FMAs (every build), as bf16 pairs
# (vdpbf16ps, AVX512-BF16), or as bf16 pairs on AMX tiles (the same panels, K padded to 32).
BF16_PATHS = ("widened", "pairs", "amx")


def bf16_paths(lib) -> list[str]:
    """The bf16 GEMM paths this build of the kernels has on this machine."""
    return ["widened"] + (["pairs"] if lib.lean_bf16_dot() else []) + (["amx"] if lib.lean_amx() else [])
