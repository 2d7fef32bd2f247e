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
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import nn

from . import native
from .ops import NativeOps, Weight


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


def drafting_ops(module: nn.Module) -> NativeOps | None:
    """The native kernels a module drafts on, inside `native_drafting(module)`; else None."""
    return getattr(module, "_native_drafting_ops", None)


@contextlib.contextmanager
def native_drafting(module: nn.Module) -> Iterator[int]:
    """Within the block, the module's nn.Linear layers decode through the native GEMM, and
    states it starts may draft on the kernels (`drafting_ops`); yields how many linears were
    routed (0 where the kernels are unavailable). Nested blocks over the same module are
    one: the outermost routes and restores (eval's `score` opens its own inside a caller's)."""
    if drafting_ops(module) is not None:
        yield sum(isinstance(m, nn.Linear) for m in module.modules())
        return
    lib = native.load()
    linears = [m for m in module.modules() if isinstance(m, nn.Linear)] if lib is not None else []
    ops = NativeOps(lib) if lib is not None else None
    cache = getattr(module, "_native_linear_packs", None)
    if cache is None and ops is not None:
        cache = {}
        object.__setattr__(module, "_native_linear_packs", cache)  # packs survive between eval calls
    for m in linears:
        m.forward = _fast_forward(m, cache.setdefault(id(m), _Packed(ops)), type(m).forward.__get__(m))
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
