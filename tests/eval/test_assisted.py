"""The draft_lm speculator as transformers' assistant: it drafts, and greedy output is unchanged."""

import pytest
import torch

from speclab.eval.assisted import assistant_model
from speclab.eval.engine import generate_plain
from speclab.speculator.base import TargetInfo
from speclab.speculator.families import build_speculator
from speclab.speculator.target.builders import tiny_llama

DRAFT = {"num_layers": 1, "hidden_size": 32, "num_heads": 2, "intermediate_size": 64}


@pytest.mark.parametrize("vocab", [0, 64])
def test_assisted_generation_drafts_with_the_speculator(vocab):
    target = tiny_llama()
    draft = build_speculator("draft_lm", {**DRAFT, "draft_vocab_size": vocab}, TargetInfo.of(target)).eval()
    assistant = assistant_model(draft, target.model, num_assistant_tokens=3)
    assert assistant.model is draft.body  # shared weights, not a copy
    calls = []
    handle = draft.body.register_forward_pre_hook(lambda *_: calls.append(1))
    prompt = torch.tensor([[1, 5, 9, 13, 20]])
    out = target.model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), assistant_model=assistant,
                                do_sample=False, max_new_tokens=12, eos_token_id=[2], pad_token_id=2)
    handle.remove()
    assert calls, "transformers never called the assistant"
    assert out[0, 5:].tolist() == generate_plain(target, prompt, 12, eos_ids=[2]).tokens
    if vocab:  # the full-vocabulary head puts -inf outside the draft vocabulary
        logits = assistant(input_ids=prompt).logits[0, -1]
        assert torch.isinf(logits).sum() == target.vocab_size - vocab
        assert torch.isfinite(logits[draft.vocab.ids]).all()
