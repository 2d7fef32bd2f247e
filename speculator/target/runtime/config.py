"""Which transformers configs the lean decoder runs, read into one flat dataclass.

Supported: Llama-family decoders (llama, mistral, qwen2) with RMSNorm, RoPE, grouped-query
attention and a SwiGLU MLP, tied or untied head, optional q/k/v bias (Qwen2). Anything else
raises `UnsupportedModel` with the reason, and the target falls back to transformers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SUPPORTED_TYPES = ("llama", "mistral", "qwen2")
# Rope types whose frequencies do not depend on the sequence length (transformers computes
# inv_freq and an attention scaling once): the cos/sin table is then fixed.
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope")


class UnsupportedModel(ValueError):
    """The lean runtime cannot run this model; the reason says why."""


@dataclass(frozen=True)
class LeanConfig:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_eps: float
    max_positions: int
    qkv_bias: bool
    tied_head: bool

    @property
    def qkv_width(self) -> int:
        return (self.num_heads + 2 * self.num_kv_heads) * self.head_dim


def _rope_type(config) -> str:
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    return params.get("rope_type", params.get("type", "default"))


def lean_config(config) -> LeanConfig:
    """The lean view of a transformers config, or UnsupportedModel."""
    kind = getattr(config, "model_type", None)
    if kind not in SUPPORTED_TYPES:
        raise UnsupportedModel(f"model_type {kind!r} is not a Llama-family decoder ({', '.join(SUPPORTED_TYPES)})")
    if getattr(config, "hidden_act", "silu") != "silu":
        raise UnsupportedModel(f"hidden_act {config.hidden_act!r}: the lean MLP is SwiGLU (silu)")
    if getattr(config, "mlp_bias", False):
        raise UnsupportedModel("mlp_bias=True is not supported")
    rope = _rope_type(config)
    if rope not in STATIC_ROPE_TYPES:
        raise UnsupportedModel(f"rope type {rope!r} depends on the sequence length; supported: {STATIC_ROPE_TYPES}")
    window = getattr(config, "sliding_window", None)
    if window is not None and getattr(config, "use_sliding_window", kind == "mistral"):
        if window < config.max_position_embeddings:
            raise UnsupportedModel(f"sliding-window attention (window {window}) is not supported")
    heads, kv = config.num_attention_heads, getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    if heads % kv:
        raise UnsupportedModel(f"{heads} attention heads do not split into {kv} key/value groups")
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    if head_dim % 2:
        raise UnsupportedModel(f"head_dim {head_dim} is odd: RoPE rotates pairs")
    bias = bool(getattr(config, "attention_bias", kind == "qwen2"))
    return LeanConfig(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size,
        num_layers=config.num_hidden_layers, num_heads=heads, num_kv_heads=kv, head_dim=head_dim,
        intermediate_size=config.intermediate_size, rms_eps=float(config.rms_norm_eps),
        max_positions=int(config.max_position_embeddings), qkv_bias=bias,
        tied_head=bool(getattr(config, "tie_word_embeddings", False)),
    )


def rope_tables(rotary, head_dim: int, positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [positions, head_dim / 2] in fp32 from the model's own rotary embedding
    module (its inv_freq and attention scaling, whatever the rope type), as it computes them."""
    inv_freq = rotary.inv_freq.float().cpu()
    if inv_freq.numel() != head_dim // 2:
        raise UnsupportedModel(f"partial rotary embeddings ({inv_freq.numel()} of {head_dim // 2} pairs) are not supported")
    scaling = float(getattr(rotary, "attention_scaling", 1.0))
    freqs = torch.arange(positions, dtype=torch.float32)[:, None] * inv_freq[None]  # [P, hd/2]
    return (freqs.cos() * scaling).contiguous(), (freqs.sin() * scaling).contiguous()
