"""The `mlp` speculator's greedy chain on the lean kernels: k stages in one native call.

Eager PyTorch runs an `mlp` stage (speculator/mlp.py) as some twenty small ops around its two
matrix-vector products (the projection, the draft vocabulary's head): on SmolLM2's 1M-token
`mlp` a 2-token chain took 0.60 ms with its weights in cache, 1.19 ms after a target pass
had evicted them, where the ~4 MB it streams take under 0.2 ms; in one call, 0.14 and 0.40
ms (docs/archive/results-history.md). kernels/native/drafting.c's `lean_mlp_chain`
runs the whole chain, projections and head through the same GEMM as the module's linear
layers under `native_drafting` (the same packs, so bf16 beside a bf16 target), the rest in
fp32 as the module computes it; drafts only propose, so the last bits never reach what
decoding commits. Tokens only: callers that read the draft logits keep the eager path.
"""

from __future__ import annotations

import ctypes

import torch
from torch import nn

from speclab.kernels.native.ops import NativeOps, _ptr


class MLPStage(ctypes.Structure):
    """One stage's pointers as drafting.c's `lean_mlp_stage` reads them."""

    _fields_ = [(name, ctypes.c_void_p) for name in ("proj", "emb", "head", "norm_weight", "norm_bias")] + [
        (name, ctypes.c_int) for name in ("proj_format", "emb_bf16", "head_format")] + [("eps", ctypes.c_float)]


class NativeMLPChain:
    """An `mlp` speculator's stages packed for `lean_mlp_chain` (built by `of`, which packs
    again only when a weight changes)."""

    def __init__(self, module: nn.Module, ops: NativeOps):
        self.ops = ops
        self.hidden_size = module.proj[0].in_features
        self.width = module.config.inner_dim
        self.vocab_size = module.vocab.size
        self.state_weight, self.emb_weight = module.state_weight, module.emb_weight
        self.vocab_ids = None if module.vocab.full else module.vocab.ids.to(torch.int64).contiguous()
        self._keep: dict[int, object] = {}  # what the stage pointers read, one pack per shared module
        self.stages = (MLPStage * module.config.n_predict)()
        with torch.no_grad():
            for i, slot in enumerate(self.stages):
                proj, head = self._linear(module._pick(module.proj, i)), self._linear(module._pick(module.head, i))
                emb, norm = self._table(module._pick(module.emb, i)), module._pick(module.norm, i)
                weight, bias = self._norm(norm)
                slot.proj, slot.head = proj.data.data_ptr(), head.data.data_ptr()
                slot.proj_format, slot.head_format = ops.weight_format(proj.data.dtype), ops.weight_format(head.data.dtype)
                slot.emb, slot.emb_bf16 = emb.data_ptr(), int(emb.dtype == torch.bfloat16)
                slot.norm_weight, slot.norm_bias, slot.eps = weight.data_ptr(), bias.data_ptr(), norm.eps
        self.work = torch.empty(max(self.hidden_size, self.width) + self.width + self.vocab_size)

    @classmethod
    def of(cls, module: nn.Module, ops: NativeOps) -> "NativeMLPChain":
        key = (tuple((p.data_ptr(), p._version, p.dtype) for p in module.parameters()),
               id(ops.lib), ops.bf16_path, getattr(ops, "weight_dtype", None))  # what the packing depends on
        packed = getattr(module, "_native_chain", None)
        if packed is None or packed[0] != key:
            packed = (key, cls(module, ops))
            object.__setattr__(module, "_native_chain", packed)  # not a module attribute: never saved
        return packed[1]

    def _linear(self, linear: nn.Linear):
        if linear.bias is not None:
            raise ValueError("the mlp speculator's linear layers are bias-free")
        if id(linear) not in self._keep:
            self._keep[id(linear)] = self.ops.pack(linear.weight.detach())
        return self._keep[id(linear)]

    def _table(self, embedding: nn.Embedding) -> torch.Tensor:
        table = embedding.weight.detach()
        if table.dtype not in (torch.float32, torch.bfloat16):
            table = table.float()
        return self._keep.setdefault(id(embedding), table.contiguous())

    def _norm(self, norm: nn.LayerNorm) -> tuple[torch.Tensor, torch.Tensor]:
        D = self.width
        weight = torch.ones(D) if norm.weight is None else norm.weight.detach().float().contiguous()
        bias = torch.zeros(D) if norm.bias is None else norm.bias.detach().float().contiguous()
        return self._keep.setdefault(id(norm), (weight, bias))

    def propose(self, hidden: torch.Tensor, token: int, k: int, states: bool = False):
        """hidden [1, H] (the target's at the last committed position), token the pending one
        -> drafts [1, k] as target ids; with `states`, also each stage's state [k, D]."""
        if not 0 <= k <= len(self.stages):
            raise ValueError(f"the mlp speculator drafts 0..{len(self.stages)} tokens, asked for {k}")
        x = hidden.reshape(-1).to(torch.float32).contiguous()
        drafts = torch.empty(k, dtype=torch.int64)
        out = torch.empty(k, self.width) if states else None
        self.ops.lib.lean_mlp_chain(self.stages, k, _ptr(x), token, self.hidden_size, self.width, self.vocab_size,
                                    _ptr(self.vocab_ids), self.state_weight, self.emb_weight, _ptr(self.work),
                                    _ptr(drafts), _ptr(out))
        return (drafts.view(1, k), out) if states else drafts.view(1, k)
