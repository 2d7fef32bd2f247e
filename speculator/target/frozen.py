"""The frozen target: a causal LM wrapped for speculative decoding.

One call gives logits, the last hidden state (the LM head's input, i.e. after the final
norm) and any requested intermediate hidden states, with an incremental KV cache that
can be rolled back by n tokens when drafts are rejected.

Two runtimes sit behind the same calls (`runtime`):
- `lean` (the default where the architecture is supported): runtime/, a Llama-family
  decoder over a static KV cache; outputs are fp32 whatever the weights' dtype.
- `hf`: the transformers model with its DynamicCache; any architecture, and the reference
  the lean runtime is tested against.
The transformers model is kept in both cases: its LM head and embeddings are the target's
own tensors for speculators, and the peers of `speclab bench` run it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Sequence

import torch
from torch import nn
from transformers import DynamicCache

from speclab.kernels.native.ops import native_lib

from .cpu_gemm import prefer_fast_small_gemm
from .profile import KernelChoices, MachineProfile, kernel_choices
from .runtime.cache import StaticKVCache
from .runtime.config import UnsupportedModel
from .runtime.model import LeanDecoder

log = logging.getLogger(__name__)
RUNTIMES = ("lean", "hf")


@dataclass
class TargetOutput:
    logits: torch.Tensor | None  # [B, T', V], T' = T or 1 (logits_for="last")
    hidden: torch.Tensor  # [B, T, H] after the final norm: what the LM head reads
    layers: dict[int, torch.Tensor] = field(default_factory=dict)  # id -> [B, T, H]


class FrozenTarget(nn.Module):
    """A causal LM in eval mode with no gradients, plus the helpers decoding needs."""

    def __init__(self, model: nn.Module, tokenizer, name: str, runtime: str = "lean", lean_backend: str = "auto",
                 compile: bool = False, profile: MachineProfile | None = None):
        """profile: the machine profile whose kernel choices the lean runtime is built with
        (default: the one recorded for this machine; profile.py). Nothing is timed here."""
        super().__init__()
        prefer_fast_small_gemm()  # before this target's first GEMM (a no-op once chosen)
        if runtime not in RUNTIMES:
            raise ValueError(f"unknown target runtime {runtime!r}; valid: {', '.join(RUNTIMES)}")
        self.model = model.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.tokenizer = tokenizer
        self.name = name
        cfg = model.config
        self.vocab_size: int = cfg.vocab_size
        self.hidden_size: int = cfg.hidden_size
        self.num_layers: int = cfg.num_hidden_layers
        self.lean: LeanDecoder | None = None
        if runtime == "lean":
            try:
                lib = native_lib(self.device, lean_backend)
                # fp32 weights read neither choice: only a bf16 target looks them up
                bf16 = lib is not None and self.dtype == torch.bfloat16
                kernels = kernel_choices(lib, profile) if bf16 else KernelChoices()
                self.lean = LeanDecoder(self.model, lean_backend, compile, bf16_path=kernels.bf16_path,
                                        wide=kernels.wide)
            except UnsupportedModel as exc:
                log.warning("%s: the lean runtime does not run this model (%s); using transformers", name, exc)

    @property
    def runtime(self) -> str:
        """What actually runs: `lean` (with its backend, e.g. lean/native or lean/native/amx) or `hf`."""
        return f"lean/{self.lean.backend}" if self.lean is not None else "hf"

    @property
    def dtype(self) -> torch.dtype:
        """The weights' dtype."""
        return self.model.lm_head.weight.dtype

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype of the target's arithmetic and outputs: fp32 on the lean runtime (its
        bf16 weights widen exactly), the weights' dtype on transformers. Speculators scored
        against this target run in it by default."""
        return torch.float32 if self.lean is not None else self.dtype

    @property
    def device(self) -> torch.device:
        return self.model.lm_head.weight.device

    @property
    def context_length(self) -> int:
        """Positions the model was trained for (prompt + generated + draft tokens must fit)."""
        return int(getattr(self.model.config, "max_position_embeddings", 1 << 30))

    @property
    def lm_head_weight(self) -> torch.Tensor:  # [V, H] in compute_dtype
        """The head as the target computes with it: widened once to fp32 on the lean runtime,
        so training's target logits (and speculators drafting through the head) never run
        bf16 matmuls, which are emulated and slow on CPUs without AVX512-BF16."""
        return self._in_compute_dtype("lm_head", self.model.lm_head.weight)

    @property
    def embed_weight(self) -> torch.Tensor:  # [V, H] in compute_dtype
        return self._in_compute_dtype("embed", self.model.get_input_embeddings().weight)

    @property
    def norm_weight(self) -> torch.Tensor | None:  # [H] in the target's dtype: the final norm before the head
        norm = getattr(self.model.get_decoder(), "norm", None)
        return None if norm is None else norm.weight.detach()

    def layer_state(self, i: int) -> dict[str, torch.Tensor]:
        """Decoder layer i's weights by HF name, in the target's dtype (a draft layer that starts
        as it copies them in, widening them to its own)."""
        return dict(self.model.get_decoder().layers[i].state_dict())

    def _in_compute_dtype(self, key: str, weight: torch.Tensor) -> torch.Tensor:
        if weight.dtype == self.compute_dtype:
            return weight
        widened = self.__dict__.setdefault("_widened", {})
        if key not in widened:
            widened[key] = weight.detach().to(self.compute_dtype)
        return widened[key]

    @property
    def eos_token_ids(self) -> set[int]:
        ids = self.model.generation_config.eos_token_id
        if ids is None:
            ids = self.tokenizer.eos_token_id
        return set(ids if isinstance(ids, list) else [ids])

    def new_cache(self, max_len: int | None = None) -> StaticKVCache | DynamicCache:
        """An empty KV cache for one sequence; the lean one holds max_len positions (default:
        the model's context)."""
        if self.lean is not None:
            return self.lean.new_cache(rows=1, max_len=max_len)
        return DynamicCache(config=self.model.config)

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,  # [B, T]
        cache: DynamicCache | None = None,
        layer_ids: Sequence[int] = (),
        logits_for: Literal["all", "last", "none"] = "all",
        attention_mask: torch.Tensor | None = None,  # [B, past + T], 1 = real token; or [B, 1, T, past + T]
        position_ids: torch.Tensor | None = None,  # [B, T]; default past .. past + T - 1
        invariant: bool = True,
    ) -> TargetOutput:
        """A 4-D attention_mask is used as given (transformers' custom-mask path): an additive
        float mask in the model's dtype, 0 where a query may attend and dtype-min elsewhere;
        with explicit position_ids this verifies a token tree in one pass (see `tree_mask`).
        invariant=False: a wide pass whose rows need not equal 1-row passes bit for bit (a
        prefill, a teacher-forced batch) may take the lean runtime's faster GEMM
        (kernels/native/wide_gemm.py)."""
        if self.lean is not None:
            if attention_mask is not None and attention_mask.dtype != torch.bool:
                raise ValueError("the lean runtime takes a tree mask from tree_mask(), not a padding mask")
            out = self.lean.forward(input_ids, cache, positions=position_ids, mask=attention_mask,
                                    layer_ids=layer_ids, logits_for=logits_for, invariant=invariant)
            return TargetOutput(logits=out.logits, hidden=out.hidden, layers=out.layers)
        out = self.model.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            cache=cache,
            use_cache=cache is not None,
            output_hidden_states=bool(layer_ids),
        )
        hidden = out.last_hidden_state  # [B, T, H], final norm applied
        # hidden_states[0] is the embedding output, hidden_states[i] the output of layer i.
        layers = {i: out.hidden_states[i] for i in layer_ids}
        if logits_for == "none":
            logits = None
        elif logits_for == "last":
            logits = self.model.lm_head(hidden[:, -1:])
        else:
            logits = self.model.lm_head(hidden)
        return TargetOutput(logits=logits, hidden=hidden, layers=layers)

    def tree_mask(self, allowed: torch.Tensor, past: int) -> torch.Tensor:
        """allowed [T, T] bool (query i may see new token j) -> the mask `forward` takes: for
        the lean runtime allowed itself; for transformers an additive mask [1, 1, T, past + T]
        in the model's dtype. Every query also sees the whole cached prefix."""
        if self.lean is not None:
            return allowed.bool()
        T = allowed.shape[0]
        see = torch.cat([allowed.new_ones(T, past), allowed], dim=1)  # [T, past + T]
        mask = torch.zeros(T, past + T, dtype=self.dtype, device=self.device)
        mask.masked_fill_(~see.to(self.device), torch.finfo(self.dtype).min)
        return mask[None, None]

    @staticmethod
    def keep(cache: StaticKVCache | DynamicCache, start: int, indices: torch.Tensor) -> None:
        """Keep the cached prefix [0, start) and, after it, only the positions start + indices
        (indices [n] ascending long, relative to start): a verified tree's accepted path."""
        if isinstance(cache, StaticKVCache):
            cache.keep(start, indices)
            return
        for layer in cache.layers:
            if not layer.is_initialized:
                continue
            picked = (start + indices).to(layer.keys.device)
            layer.keys = torch.cat([layer.keys[..., :start, :], layer.keys.index_select(-2, picked)], dim=-2)
            layer.values = torch.cat([layer.values[..., :start, :], layer.values.index_select(-2, picked)], dim=-2)

    @staticmethod
    def rollback(cache: StaticKVCache | DynamicCache, n: int) -> None:
        """Forget the last n cached positions (rejected draft tokens)."""
        if isinstance(cache, StaticKVCache):
            cache.rollback(n)
        elif n > 0:
            cache.crop(-n)  # transformers>=5: a negative count removes that many
