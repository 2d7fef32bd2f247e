"""The feature-autoregressive drafts' decoder layers (EAGLE, EAGLE-3) on the lean kernels.

Eager PyTorch runs one draft layer step as some sixty small ops (norms, rotary, attention's
reshapes and softmax, the MLP's activation, the residuals): on SmolLM2's `eagle3` at 1M
answers they were 1.2 ms of a 2.0 ms step whose projections took 0.8 ms. Here a layer step
is nine native calls, those of the target's own lean decoder (target/runtime/model.py): the input norm(s),
the fused q/k/v projection, the runtime's attention over a static KV cache (rotary applied
there), o added into the residual in place, the fused gate/up, SiLU times up, down added
into the residual.

The cache holds the committed positions at slots 0..length-1. A chain step at position
length + p writes its key at slot length + p and sees every slot before it: for one row
that is exactly layers.py's attention over the prefix plus the row's own chain, whose
earlier keys are the slots between length and it. Committed positions overwrite those
slots later. Trees (several rows, each with its own chain) read the committed part through
the eager layers instead (`prefix_kv`).

Activations run in fp32 over the layers' weights as the ops pack them (their own dtype, or
the one `native_drafting` names: bf16 read as the native GEMM reads the target's), as the
target's lean decoder does; drafts only propose, so the last bits never reach what decoding
commits.
"""

from __future__ import annotations

import torch
from torch import nn

from speclab.kernels.native.ops import NativeOps

from .layers import KV, DecoderLayer, FusedInputLayer, rope
from .target.runtime.model import LeanDecoder


def supports(layers: nn.ModuleList) -> bool:
    """Whether these draft layers have the structure the lean step computes: Llama layers,
    the first possibly EAGLE-3's fused-input one, one shape of attention throughout."""
    if not len(layers) or type(layers[0]) not in (DecoderLayer, FusedInputLayer):
        return False
    if any(type(layer) is not DecoderLayer for layer in layers[1:]):
        return False
    shapes = {(l.self_attn.heads, l.self_attn.kv_heads, l.self_attn.head_dim) for l in layers}
    norms = [n for l in layers for n in (l.input_layernorm, l.post_attention_layernorm, getattr(l, "hidden_norm", None))
             if n is not None]
    return len(shapes) == 1 and all(n.weight is not None for n in norms) and len({n.eps for n in norms}) == 1


def _weights_key(layers: nn.ModuleList) -> tuple:
    return tuple((p.data_ptr(), p._version, p.dtype) for p in layers.parameters())


class LeanDraftLayers:
    """A draft's decoder layers packed for the native kernels (built by `of`, which repacks
    only when a weight changes)."""

    def __init__(self, layers: nn.ModuleList, theta: float, ops: NativeOps):
        first = layers[0].self_attn
        self.ops, self.theta = ops, theta
        self.heads, self.kv_heads, self.head_dim = first.heads, first.kv_heads, first.head_dim
        self.width = layers[0].post_attention_layernorm.weight.shape[0]
        self.eps = layers[0].input_layernorm.eps or torch.finfo(torch.float32).eps
        # The layers use transformers' parameter names, so the target's own packing serves.
        with torch.no_grad():
            self.layers = [LeanDecoder._layer(layer, ops) for layer in layers]
        fused = isinstance(layers[0], FusedInputLayer)  # EAGLE-3: its hidden half has its own norm
        self.hidden_norm = layers[0].hidden_norm.weight.detach().float().contiguous() if fused else None

    @classmethod
    def of(cls, layers: nn.ModuleList, theta: float, ops: NativeOps) -> "LeanDraftLayers":
        key = (_weights_key(layers), theta, ops.bf16_path, getattr(ops, "weight_dtype", None))  # what the packing depends on
        packed = getattr(layers, "_lean_draft", None)
        if packed is None or packed[0] != key:
            packed = (key, cls(layers, theta, ops))
            object.__setattr__(layers, "_lean_draft", packed)  # not a module attribute: never saved
        return packed[1]

    def new_cache(self, capacity: int = 256) -> "LeanDraftCache":
        return LeanDraftCache(self, capacity)

    def run(self, x: torch.Tensor, cache: "LeanDraftCache", start: int) -> torch.Tensor:
        """x [T, d_in] (the first layer's input) at positions start..start+T-1, causal among
        themselves, their keys written at those slots -> the last layer's output [T, D] fp32."""
        T = x.shape[0]
        cache.reserve(start + T)
        ops, D = self.ops, self.width
        x = x.to(torch.float32, copy=True)
        positions = torch.arange(start, start + T, dtype=torch.int64)
        lens = torch.tensor([start], dtype=torch.int64)
        for i, (layer, k, v) in enumerate(zip(self.layers, cache.k, cache.v)):
            if i == 0 and self.hidden_norm is not None:  # [embedding, hidden]; the hidden half is the residual
                embeds, x = x[:, :D].contiguous(), x[:, D:].contiguous()
                h = torch.cat([ops.rmsnorm(embeds, layer.attn_norm, self.eps), ops.rmsnorm(x, self.hidden_norm, self.eps)], 1)
            else:
                h = ops.rmsnorm(x, layer.attn_norm, self.eps)
            qkv = ops.linear(h, layer.qkv)
            attended = ops.attention(qkv, positions, cache.cos, cache.sin, k, v, cache.row, lens, None, 1, T,
                                     self.heads, self.kv_heads, self.head_dim)
            x = ops.linear(attended, layer.o, out=x)  # x += attention
            gate_up = ops.linear(ops.rmsnorm(x, layer.mlp_norm, self.eps), layer.gate_up)
            x = ops.linear(ops.silu_mul(gate_up), layer.down, out=x)  # x += MLP
        return x


class LeanDraftCache:
    """Per layer keys and values [1, KV, capacity, hd] fp32 (rotated, as layers.py keeps
    them), and the rotary tables for every slot; the capacity doubles when a pass needs it."""

    def __init__(self, layers: LeanDraftLayers, capacity: int):
        self.layers = layers
        self.row = torch.zeros(1, dtype=torch.int64)
        shape = (1, layers.kv_heads, capacity, layers.head_dim)
        self.k = [torch.zeros(shape) for _ in layers.layers]
        self.v = [torch.zeros(shape) for _ in layers.layers]
        self._tables(capacity)

    @property
    def capacity(self) -> int:
        return self.k[0].shape[2]

    def _tables(self, capacity: int) -> None:
        cos, sin = rope(torch.arange(capacity), self.layers.head_dim, self.layers.theta)  # [S, hd], halves equal
        half = self.layers.head_dim // 2
        self.cos, self.sin = cos[:, :half].contiguous(), sin[:, :half].contiguous()

    def reserve(self, length: int) -> None:
        if length <= self.capacity:
            return
        capacity = max(length, 2 * self.capacity)
        for cache in (self.k, self.v):
            for i, old in enumerate(cache):
                cache[i] = torch.zeros(*old.shape[:2], capacity, old.shape[3])
                cache[i][:, :, : old.shape[2]] = old
        self._tables(capacity)

    def prefix_kv(self, length: int, dtype: torch.dtype) -> list[KV]:
        """The committed slots 0..length-1 as layers.py's prefix keys/values [1, KV, length, hd]."""
        return [(k[:, :, :length].to(dtype), v[:, :, :length].to(dtype)) for k, v in zip(self.k, self.v)]
