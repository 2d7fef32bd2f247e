"""Prompts as the target reads them: chat rendered through its tokenizer's template, token
ids, and left-padded batches for transformers' `generate`. Training's data pipeline and
eval's runtime bench both build prompts this way."""

from __future__ import annotations

import torch


def _require_template(tokenizer) -> None:
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("the target's tokenizer has no chat template: chat data and "
                         "self-distillation need an instruct target (or use data.source=text)")


def render(tokenizer, messages: list[dict], generation_prompt: bool) -> str:
    _require_template(tokenizer)
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


def tokenize(tokenizer, text: str) -> list[int]:
    # The template already renders every special token it wants (BOS included).
    return tokenizer(text, add_special_tokens=False).input_ids


def prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of `messages` followed by the assistant header: what `generate` continues."""
    return tokenize(tokenizer, render(tokenizer, messages, generation_prompt=True))


def pad_id(target) -> int:
    """The id padding a batch of the target's prompts: its pad token, else an end token."""
    pad = target.tokenizer.pad_token_id
    return pad if pad is not None else min(target.eos_token_ids)


def left_pad(rows: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Left padding keeps every prompt's last token in the last column, where generation
    continues. Returns input_ids [B, T] and attention_mask [B, T] (1 = real token)."""
    width = max(len(r) for r in rows)
    ids = [[pad_id] * (width - len(r)) + r for r in rows]
    mask = [[0] * (width - len(r)) + [1] * len(r) for r in rows]
    return torch.tensor(ids, device=device), torch.tensor(mask, device=device)
