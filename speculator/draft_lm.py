"""An independent small causal LM on the target's tokenizer (classic draft-model speculation).

It reads only tokens, never the target's features, so it can also serve as
transformers' assisted-generation assistant. Its body is a small Llama from
`transformers`, so it inherits the KV cache (and its rollback) the target uses; its output
layer covers the draft vocabulary (all target tokens, or the most frequent N).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn
from transformers import DynamicCache, LlamaConfig, LlamaModel

from .base import Features, Speculator, TargetInfo


@dataclass
class DraftLMConfig:
    num_layers: int = 2
    """Decoder layers."""
    hidden_size: int = 256
    """Width; may differ from the target's."""
    num_heads: int = 4
    """Attention heads (head dim = hidden_size / num_heads)."""
    intermediate_size: int = 768
    """MLP width of each layer."""
    init_from_target: bool = True
    """Start the embedding and output layer from the target's embedding: copied when widths
    match, else its top principal directions (so similar tokens start close, as in the target)."""
    max_positions: int = 4096
    """Longest context it can read."""
    draft_vocab_size: int = 8192
    """Draft only the N most frequent assistant tokens of the training data (0: all; 8192 of
    SmolLM2's 49,152 keeps its output layer a sixth of the full one, docs/design.md)."""


@dataclass
class DraftLMState:
    cache: DynamicCache
    unfed: list[int] = field(default_factory=list)  # committed tokens not yet in the cache
    drafted: int = 0  # k of the last proposal


class DraftLM(Speculator):
    family = "draft_lm"
    Config = DraftLMConfig
    shift = 0

    def __init__(self, config: DraftLMConfig, target: TargetInfo):
        super().__init__(config, target)
        if config.hidden_size % config.num_heads:
            raise ValueError(f"draft_lm hidden_size {config.hidden_size} must divide by num_heads {config.num_heads}")
        self.body = LlamaModel(LlamaConfig(
            vocab_size=target.vocab_size,
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            num_hidden_layers=config.num_layers,
            num_attention_heads=config.num_heads,
            num_key_value_heads=config.num_heads,
            max_position_embeddings=config.max_positions,
        ))
        self.head = nn.Linear(config.hidden_size, self.vocab.size, bias=False)
        if config.init_from_target and target.embed_weight is not None:
            self._init_from_embedding(target.embed_weight.float())

    @torch.no_grad()
    def _init_from_embedding(self, target_embed: torch.Tensor) -> None:  # [V, H_target]
        d = self.config.hidden_size
        if target_embed.shape[1] == d:
            init = target_embed
        else:
            centred = target_embed - target_embed.mean(0)
            q = min(d, centred.shape[1])
            _, _, v = torch.pca_lowrank(centred, q=q, center=False, niter=2)  # v: [H_target, q]
            init = centred @ v
            if q < d:  # wider than the target: the extra directions start random
                extra = torch.randn(init.shape[0], d - q, generator=torch.Generator().manual_seed(0))
                init = torch.cat([init, extra * init.std()], 1)
        # keep the per-entry scale of a fresh embedding so the first layers see familiar inputs
        init = init * (self.body.config.initializer_range / init.std().clamp_min(1e-8))
        self.body.get_input_embeddings().weight.copy_(init)
        self.head.weight.copy_(init[self.vocab.ids])

    def draft_states(self, feats: Features) -> torch.Tensor:  # [B, 1, T, d]
        return self.body(input_ids=feats.input_ids).last_hidden_state.unsqueeze(1)

    def draft_head(self, p: int, states: torch.Tensor) -> torch.Tensor:
        return self.head(states)

    def draft_head_weight(self, p: int) -> torch.Tensor:  # [N, d]: the head is a bias-free Linear
        return self.head.weight

    # --- inference ----------------------------------------------------------------

    def start(self, prompt_ids: torch.Tensor, prompt_hidden: torch.Tensor, layers=None) -> DraftLMState:
        return DraftLMState(cache=DynamicCache(config=self.body.config), unfed=prompt_ids[0].tolist())

    @torch.no_grad()
    def propose(self, state: DraftLMState, pending: torch.Tensor, k: int):
        feed = torch.tensor([state.unfed + pending[0].tolist()], dtype=torch.long)  # [1, n]
        state.unfed, state.drafted = [], k
        tokens, logits = [], []
        for _ in range(k):
            hidden = self.body(input_ids=feed, cache=state.cache, use_cache=True).last_hidden_state
            step_logits = self.head(hidden[:, -1])  # [1, N]
            feed = self.vocab.to_target(step_logits.argmax(-1, keepdim=True))  # [1, 1] target id
            tokens.append(feed)
            logits.append(step_logits)
        return torch.cat(tokens, 1), torch.stack(logits, 1)  # [1, k], [1, k, N]

    @torch.no_grad()
    def extend(self, state: DraftLMState, pending: torch.Tensor, paths: torch.Tensor) -> torch.Tensor:
        """paths [M, d] -> logits [M, N] after [pending, paths[m]], all M rows in one batch.

        Only caching changes: committed tokens still waiting in `unfed` are fed first (the
        logical state is the same), then the rows run on a batch-M copy of the cache."""
        if state.unfed:
            self.body(input_ids=torch.tensor([state.unfed], dtype=torch.long, device=pending.device),
                      cache=state.cache, use_cache=True)
            state.unfed = []
        M = paths.shape[0]
        rows = DynamicCache(config=self.body.config)
        for i, layer in enumerate(state.cache.layers):
            if layer.is_initialized:  # [1, heads, S, D] -> [M, heads, S, D]
                rows.update(layer.keys.expand(M, -1, -1, -1), layer.values.expand(M, -1, -1, -1), i)
        feed = torch.cat([pending.expand(M, 1), paths], dim=1)  # [M, d + 1]
        hidden = self.body(input_ids=feed, cache=rows, use_cache=True).last_hidden_state  # [M, d + 1, D]
        return self.head(hidden[:, -1])  # [M, N]

    def accept(self, state: DraftLMState, committed: torch.Tensor, hidden: torch.Tensor, layers=None) -> None:
        # The cache now holds ..., pending, d_1..d_{k-1}. Keep pending + the accepted
        # drafts; d_k, when accepted, was never fed and waits in `unfed`.
        n, k = committed.shape[1] - 1, state.drafted
        if k == 0:  # no `propose` since the last accept (tree drafting): nothing of this step is cached
            state.unfed += committed[0].tolist()
            return
        drop = (k - 1) - min(n, k - 1)
        if drop > 0:
            state.cache.crop(-drop)
        if n == k:
            state.unfed = [int(committed[0, -1])]
        state.drafted = 0
