"""The lean decoder: a Llama-family forward pass over a static KV cache.

Built from a loaded transformers model (it reads the weights, then the lean copy is what
runs): q/k/v fused in one projection, gate/up in another, every linear prepacked for its
backend (kernels/native/ops.py). One pass takes B rows x T new tokens, each row at its
own cache row and length (rows of a batch may hold prompts of different lengths), explicit
positions and an optional [T, T] visibility mask among the new tokens (a draft tree).

Per layer (shapes with M = B * T):
    h = rmsnorm(x)                  [M, D]
    qkv = h @ Wqkv^T (+ b)          [M, (H + 2KV) hd]
    a = attention(rope(qkv), cache) [M, H hd]     new k, v written into the cache
    x += a @ Wo^T
    x += silu_mul(rmsnorm(x) @ Wgu^T) @ Wdown^T
hidden = rmsnorm(x); logits = hidden @ Whead^T for the rows asked for.

`layers` returns transformers' `hidden_states` ids: 0 is the embedding output, i in
1..L-1 the residual stream after layer i, and L the final normed state (as transformers
records it), so features match the transformers path one for one.

A pass whose caller allows it (`invariant=False`: prefills, batched generation) and that is
wide enough runs its linear layers on a wide engine where this machine measured that faster
(kernels/native/wide_gemm.py: kernels/native/decoder.c's AMX tiles, or torch's bf16 GEMM); every other pass is
batch-invariant. Which engine, and the bf16 GEMM path, are the machine profile's choices
(speclab.speculator.target.profile), passed in as data: building a decoder times nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Literal, Sequence

import torch

from speclab.kernels.native.ops import NativeOps, Weight, backend
from speclab.kernels.native.wide_gemm import WideChoice, WideLinear

from .cache import StaticKVCache
from .config import LeanConfig, lean_config, rope_tables


@dataclass
class LeanLayer:
    attn_norm: torch.Tensor  # [D] fp32
    qkv: Weight
    o: Weight
    mlp_norm: torch.Tensor  # [D] fp32
    gate_up: Weight
    down: Weight
    wide: dict[str, WideLinear] | None = None  # the four linears for torch's GEMM (wide passes)


@dataclass
class LeanOutput:
    logits: torch.Tensor | None  # [B, T', V] fp32
    hidden: torch.Tensor  # [B, T, D] fp32, after the final norm
    layers: dict[int, torch.Tensor] = field(default_factory=dict)  # hidden_states id -> [B, T, D]


class LeanDecoder:
    def __init__(self, model, choice: str = "auto", compile: bool = False, ops=None, bf16_path: str = "widened",
                 wide: WideChoice = WideChoice()):
        """model: a transformers Llama-family causal LM (lean_config says which). choice: the
        backend (kernels/native/ops.py); compile: torch.compile the torch backend's per-layer blocks (each
        pass width compiles once; the native backend is already fused C and ignores it);
        ops: a backend object to use instead of `choice` (tests: the AVX2 build on any x86).
        bf16_path, wide: the native kernels' bf16 GEMM path and wide-pass choice (the machine
        profile's, profile.kernel_choices; the defaults need no measurement)."""
        self.config: LeanConfig = lean_config(model.config)
        weights = model.lm_head.weight
        self.device, self.dtype = weights.device, weights.dtype
        self.ops = ops if ops is not None else backend(self.device, self.dtype, choice, bf16_path)
        self.compiled = compile and self.ops.name == "torch"
        if self.compiled:
            self._project, self._mlp = torch.compile(self._project, dynamic=False), torch.compile(self._mlp, dynamic=False)
        # Wide passes need bf16 weights (on a bf16 GEMM an fp32 target would be rounded) and
        # the native kernels (the torch backend is torch's GEMM already).
        self.wide: WideChoice = wide if self.dtype == torch.bfloat16 and self.ops.name == "native" else WideChoice()
        # Their engine: torch's GEMM (WideLinear copies, a Python call per linear), or decoder.c's
        # AMX tiles (a second packing of the weights, the whole stack in one call).
        self._wide_ops = NativeOps(self.ops.lib, bf16_path="amx") if self.wide.used and self.wide.engine == "amx" else None
        body = model.model
        self.embed = body.embed_tokens.weight.detach()  # [V, D], looked up then widened
        self.layers = [self._layer(layer, self.ops, torch_wide=self.wide.layer_rows is not None and self._wide_ops is None)
                       for layer in body.layers]
        self.norm = body.norm.weight.detach().float().contiguous()
        self.head = self.ops.pack(model.lm_head.weight.detach())
        self.wide_head = None
        if self.wide.head_rows and self._wide_ops is not None:
            self.wide_head = partial(self._wide_ops.linear, w=self._wide_ops.pack(model.lm_head.weight.detach()))
        elif self.wide.head_rows:
            self.wide_head = WideLinear(model.lm_head.weight, None)
        # The native backend runs a stretch of layers in one call (no per-kernel Python cost).
        self._stack = self.ops.stack(self.layers) if hasattr(self.ops, "stack") else None
        self._wide_stack = None
        if self.wide.layer_rows and self._wide_ops is not None:
            self._wide_layers = [self._layer(layer, self._wide_ops) for layer in body.layers]  # kept: the stack points into them
            self._wide_stack = self._wide_ops.stack(self._wide_layers)
        self.cos, self.sin = (t.to(self.device) for t in rope_tables(
            body.rotary_emb, self.config.head_dim, self.config.max_positions))

    @staticmethod
    def _layer(layer, ops, torch_wide: bool = False) -> LeanLayer:
        """One transformers decoder layer packed for `ops`; torch_wide: with bf16 copies for
        torch's GEMM (wide passes on the torch engine)."""
        a, m = layer.self_attn, layer.mlp
        qkv = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]).detach()
        bias = torch.cat([a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]).detach() if a.q_proj.bias is not None else None
        weights = {"qkv": qkv, "o": a.o_proj.weight.detach(), "down": m.down_proj.weight.detach(),
                   "gate_up": torch.cat([m.gate_proj.weight, m.up_proj.weight]).detach()}
        return LeanLayer(
            attn_norm=layer.input_layernorm.weight.detach().float().contiguous(),
            qkv=ops.pack(qkv, bias),
            o=ops.pack(weights["o"]),
            mlp_norm=layer.post_attention_layernorm.weight.detach().float().contiguous(),
            gate_up=ops.pack(weights["gate_up"]),
            down=ops.pack(weights["down"]),
            wide={name: WideLinear(w, bias if name == "qkv" else None) for name, w in weights.items()}
            if torch_wide else None,
        )

    def _linear(self, x: torch.Tensor, layer: LeanLayer, name: str, wide: bool,
                out: torch.Tensor | None = None) -> torch.Tensor:
        if wide:
            return layer.wide[name](x, out=out)
        return self.ops.linear(x, getattr(layer, name), out=out)

    def _project(self, x: torch.Tensor, layer: LeanLayer, wide: bool = False) -> torch.Tensor:
        """[M, D] -> qkv [M, (H + 2KV) hd]"""
        return self._linear(self.ops.rmsnorm(x, layer.attn_norm, self.config.rms_eps), layer, "qkv", wide)

    def _mlp(self, x: torch.Tensor, layer: LeanLayer, wide: bool = False) -> torch.Tensor:
        """x + MLP(x), in place where the ops allow"""
        ops = self.ops
        gate_up = self._linear(ops.rmsnorm(x, layer.mlp_norm, self.config.rms_eps), layer, "gate_up", wide)
        return self._linear(ops.silu_mul(gate_up), layer, "down", wide, out=x)

    def _layers(self, x: torch.Tensor, start: int, stop: int, cache: StaticKVCache, attend: tuple,
                wide: bool = False) -> torch.Tensor:
        """x [M, D] through layers start..stop-1 (the residual stream after them)."""
        c, ops = self.config, self.ops
        positions, cos, sin, rows, lens, visible, B, T = attend
        stack = self._wide_stack if wide else self._stack
        if stack is not None:
            ops = self._wide_ops if wide else ops
            return ops.run_layers(stack, x, start, stop, cache.k, cache.v, positions, cos, sin, rows, lens,
                                  visible, B, T, c.num_heads, c.num_kv_heads, c.head_dim, c.rms_eps)
        for i in range(start, stop):
            layer = self.layers[i]
            attended = ops.attention(self._project(x, layer, wide), positions, cos, sin, cache.k[i], cache.v[i], rows,
                                     lens, visible, B, T, c.num_heads, c.num_kv_heads, c.head_dim)
            x = self._mlp(self._linear(attended, layer, "o", wide, out=x), layer, wide)  # x += attention, then MLP
        return x

    @staticmethod
    def _wide(rows: int, invariant: bool, from_rows: int | None) -> bool:
        """Whether a pass's layers or head of this many rows run on torch's GEMM
        (kernels/native/wide_gemm.py)."""
        return not invariant and from_rows is not None and rows >= from_rows

    @property
    def backend(self) -> str:
        """e.g. native/amx: the backend, and for bf16 weights on the native kernels their GEMM
        path (ops.BF16_PATHS), which sets the logits' last bits (part of the keys of timings
        remembered per machine, such as eval's verification-cost curve)."""
        path = getattr(self.ops, "bf16_path", None) if self.dtype == torch.bfloat16 else None
        return self.ops.name + (f"/{path}" if path else "") + ("+compile" if self.compiled else "")

    def new_cache(self, rows: int = 1, max_len: int | None = None, dtype: torch.dtype = torch.float32) -> StaticKVCache:
        """dtype: fp32 (decoding and verification), or bf16 (batched generation of a bf16
        target, generate.py: half the bytes its attention reads)."""
        c = self.config
        length = min(max_len or c.max_positions, c.max_positions)
        return StaticKVCache(c.num_layers, rows, c.num_kv_heads, length, c.head_dim, self.device, dtype)

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, cache: StaticKVCache | None = None, rows: Sequence[int] | None = None,
                positions: torch.Tensor | None = None, mask: torch.Tensor | None = None,
                layer_ids: Sequence[int] = (), logits_for: Literal["all", "last", "none"] = "all",
                invariant: bool = True) -> LeanOutput:
        """input_ids [B, T]; rows: the cache row of each batch row (default 0..B-1); positions
        [B, T] (default each row's cached length onwards); mask [T, T] bool, True where new
        token i sees new token j (default causal). Without a cache a scratch one is used.
        invariant=False lets a wide pass run on torch's bf16 GEMM where this machine measured
        it faster (its rows then differ in the last bits from 1-row passes: never for
        verification)."""
        c = self.config
        B, T = input_ids.shape
        if cache is None:
            cache = self.new_cache(rows=B, max_len=T)
        rows = list(range(B)) if rows is None else list(rows)
        cache.reserve(rows, T)
        lens = torch.tensor([cache.lens[r] for r in rows], dtype=torch.int64)
        if positions is None:
            positions = lens[:, None] + torch.arange(T)[None]  # [B, T]
        positions = positions.to(dtype=torch.int64, device="cpu").contiguous()
        if int(positions.max()) >= c.max_positions:
            raise ValueError(f"position {int(positions.max())} is past the model's context ({c.max_positions})")
        row_index = torch.tensor(rows, dtype=torch.int64)
        visible = None if mask is None else mask.to(dtype=torch.uint8, device="cpu").contiguous()
        on = self.device
        positions_d, rows_d, lens_d = (t.to(on) for t in (positions, row_index, lens))
        visible_d = None if visible is None else visible.to(on)

        x = self.embed.index_select(0, input_ids.reshape(-1).to(on)).float()  # [M, D]
        wanted = set(layer_ids)
        layers = {0: x.view(B, T, -1).clone()} if 0 in wanted else {}
        ops = self.ops
        attend = (positions_d, self.cos, self.sin, rows_d, lens_d, visible_d, B, T)
        start = 0
        for stop in sorted({i for i in wanted if 0 < i < c.num_layers} | {c.num_layers}):
            x = self._layers(x, start, stop, cache, attend, self._wide(B * T, invariant, self.wide.layer_rows))
            if stop < c.num_layers:
                layers[stop] = x.view(B, T, -1).clone()
            start = stop
        cache.advance(rows, T)
        hidden = ops.rmsnorm(x, self.norm, c.rms_eps).view(B, T, -1)
        if c.num_layers in wanted:
            layers[c.num_layers] = hidden
        if logits_for == "none":
            logits = None
        else:
            rows_in = hidden[:, -1:] if logits_for == "last" else hidden
            flat = rows_in.reshape(-1, c.hidden_size).contiguous()
            head = self.wide_head if self._wide(flat.shape[0], invariant, self.wide.head_rows) else partial(ops.linear, w=self.head)
            logits = head(flat).view(B, rows_in.shape[1], -1)
        return LeanOutput(logits, hidden, layers)
