"""The lean decoder's five operations, on two backends with one signature.

- `NativeOps`: the native CPU library's kernels (decoder.c): batch-invariant, bandwidth-bound GEMV.
- `TorchOps`: the same maths in plain torch ops: the reference the kernels are tested
  against, and the path on GPUs or machines without a C compiler.

Activations are fp32 [M, width] row-major (M = batch rows x new tokens); weights are fp32
or bf16, read as fp32 (a bf16 weight widens exactly). Where the CPU may multiply bf16 pairs
(AVX512-BF16 vdpbf16ps, or AMX tiles) and that is the faster path on it
(`NativeOps.bf16_path`: measured by pair_choice.py's probe, recorded in the machine profile and
passed in as data), a GEMM over bf16 weights first rounds its input rows
to bf16; `TorchOps(round_bf16_inputs=True)` is those paths' reference. Shapes are in the
comments.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .. import native
from .bf16 import bf16_paths


@dataclass
class Weight:
    """A linear layer's weight [N, K] in the layout its backend reads."""

    data: torch.Tensor  # native: [ceil(N / NR), K, NR] panels (bf16: see NativeOps.pack); torch: [N, K]
    out_features: int  # N
    in_features: int  # K
    bias: torch.Tensor | None = None  # [N] fp32
    rounds_input: bool = False  # torch reference of the bf16-pair kernels: x rounded to bf16 first


# lean.h's enum lean_weights: how a GEMM's weights are packed (NativeOps.pack).
LEAN_FP32, LEAN_BF16_WIDENED, LEAN_BF16_PAIRS, LEAN_BF16_AMX = 0, 1, 2, 3
_BF16_FORMATS = {"widened": LEAN_BF16_WIDENED, "pairs": LEAN_BF16_PAIRS, "amx": LEAN_BF16_AMX}


def _ptr(t: torch.Tensor | None):
    return None if t is None else ctypes.c_void_p(t.data_ptr())


class NativeOps:
    name = "native"

    def __init__(self, lib, bf16_path: str = "widened"):
        """bf16_path: how bf16 weights are multiplied (BF16_PATHS); the default is the path
        every build has. Which is fastest on this machine is data from the machine profile
        (speclab.speculator.target.profile), never timed here."""
        self.lib = lib
        self.width = lib.lean_pack_width()
        if bf16_path not in bf16_paths(lib):
            raise ValueError(f"this build of the lean kernels has no {bf16_path!r} bf16 path here "
                             f"(pairs need AVX512-BF16, amx AMX tiles); it has {bf16_paths(lib)}")
        self.bf16_path = bf16_path
        self.bf16_dot = bf16_path != "widened"  # inputs rounded to bf16, weights packed as pairs

    def weight_format(self, dtype: torch.dtype) -> int:
        """lean.h's enum lean_weights for weights of this dtype as pack lays them out."""
        return LEAN_FP32 if dtype != torch.bfloat16 else _BF16_FORMATS[self.bf16_path]

    def pack(self, w: torch.Tensor, bias: torch.Tensor | None = None) -> Weight:
        """[N, K] -> panels [ceil(N / NR), K, NR]: a panel's K x NR block is contiguous, so a
        thread streams it once and every row tile reuses it from cache. bf16 weights on the
        bf16-pair paths: [ceil(N / NR), ceil(K / 2), NR, 2], the two weights one instruction
        multiplies side by side (K padded with zero columns to even, or to a multiple of 32
        for AMX tiles). bf16 weights widened: [ceil(N / NR), K, NR / (2 VL), VL, 2], outputs
        2p VL + j and (2p + 1) VL + j side by side in one 32-bit word, which one shift and
        one mask widen (decoder.c)."""
        N, K = w.shape
        pairs = self.bf16_dot and w.dtype == torch.bfloat16
        blocks = -(-N // self.width)
        width_k = (-(-K // 32) * 32 if self.bf16_path == "amx" else K + (K % 2)) if pairs else K
        padded = w.new_zeros(blocks * self.width, width_k)
        padded[:N, :K] = w
        if pairs and self.bf16_path == "amx":  # [blocks, K/32, 2 halves, 16 pairs, 16 outputs, 2]: one tile each
            panels = padded.view(blocks, 2, 16, width_k // 32, 16, 2).permute(0, 3, 1, 4, 2, 5).contiguous()
        elif pairs:
            panels = padded.view(blocks, self.width, width_k // 2, 2).permute(0, 2, 1, 3).contiguous()
        elif w.dtype == torch.bfloat16:  # widened on load: vectors (2p, 2p + 1) as interleaved halves
            vl = self.lib.lean_vector_len()
            panels = padded.view(blocks, -1, 2, vl, K).permute(0, 4, 1, 3, 2).contiguous()
        else:
            panels = padded.view(blocks, self.width, K).transpose(1, 2).contiguous()
        return Weight(panels, N, K, None if bias is None else bias.float().contiguous())

    def linear(self, x: torch.Tensor, w: Weight, out: torch.Tensor | None = None) -> torch.Tensor:
        """x [M, K] fp32 -> x @ W^T [M, N]; with `out`, adds into it in place (a residual)."""
        M = x.shape[0]
        accumulate = out is not None
        if out is None:
            out = torch.empty(M, w.out_features, dtype=torch.float32, device=x.device)
        self.lib.lean_gemm(_ptr(x), x.stride(0), _ptr(w.data), self.weight_format(w.data.dtype), _ptr(out),
                           out.stride(0), M, w.in_features, w.out_features, int(accumulate))
        if w.bias is not None:
            out += w.bias
        return out

    def rmsnorm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        out = torch.empty_like(x)
        self.lib.lean_rmsnorm(_ptr(x), _ptr(weight), _ptr(out), x.shape[0], x.shape[1], eps)
        return out

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:  # [M, 2I] -> [M, I]
        M, I = gate_up.shape[0], gate_up.shape[1] // 2
        out = torch.empty(M, I, dtype=torch.float32, device=gate_up.device)
        self.lib.lean_silu_mul(_ptr(gate_up), _ptr(out), M, I)
        return out

    def stack(self, layers) -> tuple:
        """The decoder's layers (model.LeanLayer) for `run_layers`: an array of their pointers,
        the weights' format (lean.h's lean_weights), and the widths (qkv outputs, MLP width). The layers must
        outlive it (the decoder holds both)."""
        array = (LayerStack * len(layers))()
        for slot, layer in zip(array, layers):
            for name in ("attn_norm", "mlp_norm"):
                setattr(slot, name, getattr(layer, name).data_ptr())
            slot.qkv_bias = None if layer.qkv.bias is None else layer.qkv.bias.data_ptr()
            for name in ("qkv", "o", "gate_up", "down"):
                setattr(slot, name, getattr(layer, name).data.data_ptr())
        weights = [w.data.dtype for layer in layers for w in (layer.qkv, layer.o, layer.gate_up, layer.down)]
        if len(set(weights)) != 1:
            raise ValueError(f"a decoder's linear layers must share one dtype, got {sorted(map(str, set(weights)))}")
        return array, self.weight_format(weights[0]), layers[0].qkv.out_features, layers[0].down.in_features

    def run_layers(self, stack, x, start, stop, k_cache, v_cache, positions, cos, sin, rows, lens, mask,
                   B, T, H, KV, hd, eps):
        """x [B*T, D] through layers start..stop-1 in place, in one native call (decoder.c
        lean_layers: the same kernels in the same order as the per-layer calls)."""
        array, weight_format, n_qkv, inner = stack
        M, D = x.shape
        scratch = torch.empty(M * (D + n_qkv + H * hd + 3 * inner), dtype=torch.float32)
        self.lib.lean_layers(array, start, stop, weight_format, _ptr(x), B, T, D, n_qkv, inner, eps, _ptr(k_cache),
                             _ptr(v_cache), k_cache.stride(0), _kv_bf16(k_cache, v_cache), _ptr(positions), _ptr(cos),
                             _ptr(sin), _ptr(rows), _ptr(lens), _ptr(mask), H, KV, hd, k_cache.shape[3], hd ** -0.5,
                             _ptr(scratch))
        return x

    def attention(self, qkv, positions, cos, sin, k_cache, v_cache, rows, lens, mask, B, T, H, KV, hd):
        """qkv [B*T, (H + 2KV) hd] (RoPE'd in place), positions [B, T], k/v_cache [R, KV, S, hd]
        (the new keys/values land at slots lens[b]..), rows/lens [B] int64, mask [T, T] uint8
        or None (causal) -> [B*T, H hd]."""
        out = torch.empty(B * T, H * hd, dtype=torch.float32, device=qkv.device)
        self.lib.lean_attention(_ptr(qkv), _ptr(positions), _ptr(cos), _ptr(sin), _ptr(k_cache), _ptr(v_cache),
                                _ptr(rows), _ptr(lens), _ptr(mask), _ptr(out), B, T, H, KV, hd,
                                k_cache.shape[2], hd ** -0.5, _kv_bf16(k_cache, v_cache))
        return out


def _kv_bf16(k_cache: torch.Tensor, v_cache: torch.Tensor) -> int:
    """1 for a bf16 KV cache, 0 for fp32 (decoder.c reads either)."""
    if k_cache.dtype != v_cache.dtype or k_cache.dtype not in (torch.float32, torch.bfloat16):
        raise TypeError(f"the KV cache must be fp32 or bf16, keys and values alike; got {k_cache.dtype}, {v_cache.dtype}")
    return int(k_cache.dtype == torch.bfloat16)


class LayerStack(ctypes.Structure):
    """One decoder layer's pointers as lean.h's `lean_layer` reads them."""

    _fields_ = [(name, ctypes.c_void_p) for name in ("attn_norm", "qkv_bias", "mlp_norm", "qkv", "o", "gate_up", "down")]


class TorchOps:
    name = "torch"

    def __init__(self, compute_dtype: torch.dtype = torch.float32, round_bf16_inputs: bool = False):
        self.compute_dtype = compute_dtype
        self.round_bf16_inputs = round_bf16_inputs  # the bf16-pair kernels' maths (see the module doc)

    def pack(self, w: torch.Tensor, bias: torch.Tensor | None = None) -> Weight:
        # Widened once: the maths of the native path (weights as stored, fp32 products).
        return Weight(w.to(self.compute_dtype).contiguous(), w.shape[0], w.shape[1],
                      None if bias is None else bias.float(), self.round_bf16_inputs and w.dtype == torch.bfloat16)

    def linear(self, x, w: Weight, out=None):
        if w.rounds_input:
            x = x.to(torch.bfloat16)
        y = F.linear(x.to(w.data.dtype), w.data).float()
        if w.bias is not None:
            y = y + w.bias
        if out is None:
            return y
        out += y
        return out

    def rmsnorm(self, x, weight, eps):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight

    def silu_mul(self, gate_up):
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up

    def attention(self, qkv, positions, cos, sin, k_cache, v_cache, rows, lens, mask, B, T, H, KV, hd):
        q, k, v = qkv.view(B, T, H + 2 * KV, hd).split([H, KV, KV], dim=2)  # [B, T, heads, hd]
        c, s = cos[positions][:, :, None], sin[positions][:, :, None]  # [B, T, 1, hd/2]
        q, k = _rope(q, c, s), _rope(k, c, s)
        out = torch.empty(B, T, H, hd, dtype=torch.float32, device=qkv.device)
        for b in range(B):  # the reference path: one row at a time
            row, past = int(rows[b]), int(lens[b])
            k_cache[row, :, past : past + T] = k[b].transpose(0, 1)
            v_cache[row, :, past : past + T] = v[b].transpose(0, 1)
            keys = k_cache[row, :, : past + T].float().repeat_interleave(H // KV, dim=0)  # [H, S', hd]
            values = v_cache[row, :, : past + T].float().repeat_interleave(H // KV, dim=0)
            see = torch.ones(T, past + T, dtype=torch.bool, device=qkv.device)
            new = torch.ones(T, T, dtype=torch.bool, device=qkv.device).tril() if mask is None else mask.bool()
            see[:, past:] = new
            scores = (q[b].transpose(0, 1) @ keys.transpose(1, 2)) * hd ** -0.5  # [H, T, S']
            probs = scores.masked_fill(~see, float("-inf")).softmax(-1)
            out[b] = (probs @ values).transpose(0, 1)
        return out.view(B * T, H * hd)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE: pairs (i, i + hd/2) turn by the position's angle."""
    a, b = x.chunk(2, dim=-1)
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


def native_lib(device: torch.device, choice: str = "auto"):
    """The native kernels' library the backend `choice` runs on this device, or None (torch
    ops): `auto` takes the kernels on CPU where they build."""
    if choice not in ("auto", "native", "torch"):
        raise ValueError(f"unknown lean backend {choice!r}; valid: auto, native, torch")
    lib = native.load() if device.type == "cpu" and choice != "torch" else None
    if choice == "native" and lib is None:
        raise RuntimeError("the native lean kernels are unavailable (CPU only, needs a C compiler)")
    return lib


def backend(device: torch.device, weight_dtype: torch.dtype, choice: str = "auto", bf16_path: str = "widened"):
    """`auto`: the native kernels on CPU where they build (multiplying bf16 weights on
    bf16_path), torch ops otherwise."""
    lib = native_lib(device, choice)
    if lib is not None:
        return NativeOps(lib, bf16_path)
    # CPU: fp32 products as the kernels compute them; GPU: the weights' own dtype (tensor cores).
    return TorchOps(torch.float32 if device.type == "cpu" else weight_dtype)
