"""Speculators drafting on the lean runtime's kernels: their linear layers, and the
feature-autoregressive families' decoder layers as whole native steps (lean_draft.py).

A draft step is a handful of small matrix-vector products (a projection, a vocabulary
head); on the CPUs speclab runs on, torch's fp32 GEMV streams them at a fraction of the
memory bandwidth, and drafting ends up costing as much as the target's verification.
`native_drafting(module)` routes every `nn.Linear` of the module through the native kernel
while gradients are off and the input is on the CPU (decoding), leaving training untouched,
and hands the module the kernels (`drafting_ops`) for the decoding states it starts.
Each weight is packed once and repacked only if it changes (its version counter moves).
The results equal `F.linear` to fp32 rounding; drafts only propose, so this never affects
what decoding commits.

`native_drafting(module, weight_dtype)` packs the weights in that dtype instead of their
own: scoring passes the target's, so a drafter loaded in fp32 reads bf16 weights beside a
bf16 target, as the target's own layers do (fp32 activations and sums either way). Why: a
draft step streams its weights from memory, the target's pass having just evicted them,
and fp32 doubles those bytes. On an AMX Xeon the 1M-token `mlp` drafted 1.38-1.50 -> 1.11-1.13
ms per step with the same drafts (docs/archive/results-history.md). bf16 weights are multiplied on the
machine profile's bf16 GEMM path, the target's own (speclab.speculator.target.profile).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import nn

from speclab.kernels import native
from speclab.kernels.native.ops import NativeOps, Weight

from .target.profile import kernel_choices


class _Packed:
    def __init__(self, ops: NativeOps):
        self.ops, self.key, self.weight = ops, None, None

    def get(self, linear: nn.Linear) -> Weight:
        w = linear.weight
        key = (w.data_ptr(), w._version, w.dtype, tuple(w.shape))
        if key != self.key:
            self.weight = self.ops.pack(w.detach(), None if linear.bias is None else linear.bias.detach())
            self.key = key
        return self.weight


def _fast_forward(linear: nn.Linear, packed: _Packed, original):
    def forward(x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() or x.device.type != "cpu" or linear.weight.dtype not in (torch.float32, torch.bfloat16):
            return original(x)
        rows = x.reshape(-1, x.shape[-1]).float().contiguous()
        out = packed.ops.linear(rows, packed.get(linear))
        return out.view(*x.shape[:-1], -1).to(x.dtype)

    return forward


class DraftingOps(NativeOps):
    """The native kernels, fp32 weights packed as bf16 where weight_dtype is bf16 (the
    kernels read fp32 and bf16; any other weight_dtype leaves weights as they are)."""

    def __init__(self, lib, weight_dtype: torch.dtype | None, bf16_path: str = "widened"):
        super().__init__(lib, bf16_path)
        self.weight_dtype = weight_dtype if weight_dtype == torch.bfloat16 else None

    def pack(self, w: torch.Tensor, bias: torch.Tensor | None = None) -> Weight:
        if self.weight_dtype is not None and w.dtype == torch.float32:
            w = w.to(self.weight_dtype)
        return super().pack(w, bias)


def drafting_ops(module: nn.Module) -> NativeOps | None:
    """The native kernels a module drafts on, inside `native_drafting(module)`; else None."""
    return getattr(module, "_native_drafting_ops", None)


@contextlib.contextmanager
def native_drafting(module: nn.Module, weight_dtype: torch.dtype | None = None) -> Iterator[int]:
    """Within the block, the module's nn.Linear layers decode through the native GEMM, and
    states it starts may draft on the kernels (`drafting_ops`); yields how many linears were
    routed (0 where the kernels are unavailable). weight_dtype bf16 packs fp32 weights as bf16
    (DraftingOps); None or another dtype keeps their own. Nested blocks over the same module are
    one: the outermost routes and restores (eval's `score` opens its own inside a caller's)."""
    if drafting_ops(module) is not None:
        yield sum(isinstance(m, nn.Linear) for m in module.modules())
        return
    lib = native.load()
    linears = [m for m in module.modules() if isinstance(m, nn.Linear)] if lib is not None else []
    ops = DraftingOps(lib, weight_dtype, kernel_choices(lib).bf16_path) if lib is not None else None
    cache = getattr(module, "_native_linear_packs", None)
    if cache is None and ops is not None:
        cache = {}
        object.__setattr__(module, "_native_linear_packs", cache)  # packs survive between eval calls
    for m in linears:
        packed = cache.setdefault((id(m), ops.weight_dtype), _Packed(ops))
        m.forward = _fast_forward(m, packed, type(m).forward.__get__(m))
    drafters = list(module.modules()) if ops is not None else []  # a hybrid's learned part starts its own states
    for m in drafters:
        object.__setattr__(m, "_native_drafting_ops", ops)
    try:
        yield len(linears)
    finally:
        for m in linears:
            del m.forward  # back to the class's forward
        for m in drafters:
            object.__delattr__(m, "_native_drafting_ops")
