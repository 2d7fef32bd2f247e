"""A `draft_lm` speculator as transformers' assisted-generation assistant.

transformers' `generate(assistant_model=...)` wants a causal LM with `GenerationMixin` whose
logits cover the target's vocabulary. `DraftLM` is a Llama body plus a head over its draft
vocabulary, so the assistant is a `LlamaForCausalLM` sharing that body (no copy) with a head
that scatters the draft logits into the full vocabulary, -inf outside it: the assistant can
then never propose a token the draft vocabulary lacks, exactly as in the project's engine.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import GenerationConfig, LlamaForCausalLM

from speclab.speculator.draft_lm import DraftLM


class FullVocabHead(nn.Module):
    """Draft head [.., D] -> logits over the target vocabulary [.., V], -inf off the draft vocabulary."""

    def __init__(self, draft: DraftLM):
        super().__init__()
        self.head = draft.head
        self.vocab = draft.vocab

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.head(hidden)  # [.., N]
        if self.vocab.full:
            return logits
        out = logits.new_full((*logits.shape[:-1], self.vocab.target_vocab), float("-inf"))
        return out.index_copy_(-1, self.vocab.ids, logits)


def assistant_model(draft: DraftLM, target_model, num_assistant_tokens: int) -> LlamaForCausalLM:
    """A transformers assistant wrapping `draft` (shared weights), drafting up to
    `num_assistant_tokens` per step, with transformers' other assisted-generation defaults
    (constant schedule, confidence threshold 0.4)."""
    if not isinstance(draft, DraftLM):
        raise TypeError(f"an assistant must be a draft_lm speculator, got {type(draft).__name__}")
    config = draft.body.config
    if config.vocab_size != target_model.config.vocab_size:
        raise ValueError(f"draft vocabulary {config.vocab_size} != target vocabulary {target_model.config.vocab_size}")
    with torch.device("meta"):  # the body and head below replace these weights: allocate nothing
        model = LlamaForCausalLM(config)
    model.model = draft.body
    model.lm_head = FullVocabHead(draft)
    model.config.tie_word_embeddings = False
    model.generation_config = GenerationConfig(
        num_assistant_tokens=num_assistant_tokens,
        num_assistant_tokens_schedule="constant",
        eos_token_id=target_model.generation_config.eos_token_id,
        pad_token_id=target_model.generation_config.pad_token_id,
    )
    return model.eval()
