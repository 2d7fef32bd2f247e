import pytest
import torch
from transformers import GenerationConfig

from speclab.speculator.targets import tiny_llama
from speclab.training import self_distill
from speclab.training.data_config import DataConfig
from speclab.training.data_tokenize import tokenize, user_turn_prefix
from speclab.training.self_distill import (
    Generated, distill_responses, generate_batched, sample_prompts)


def small_config(**overrides) -> DataConfig:
    base = dict(num_prompts=4, heldout_size=2, max_prompt_tokens=48, max_response_tokens=8,
                gen_batch_size=8, prompt_sampling_budget=10)
    return DataConfig(**{**base, **overrides})


def test_user_turn_prefix_is_cut_from_the_chat_template(target):
    tok = target.tokenizer
    assert user_turn_prefix(tok, "Be brief.") == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
    assert user_turn_prefix(tok, None) == "<|im_start|>user\n"


def test_user_turn_prefix_follows_a_non_chatml_template():
    tok = tiny_llama().tokenizer
    tok.chat_template = ("{% for m in messages %}{% if m['role'] == 'system' %}<<SYS>>{{ m['content'] }}<</SYS>>"
                         "{% else %}[{{ m['role'] }}] {{ m['content'] }} [end]{% endif %}{% endfor %}")
    assert user_turn_prefix(tok, "S") == "<<SYS>>S<</SYS>>[user] "


def test_left_padded_batch_generates_what_each_prompt_generates_alone(target):
    prompts = [[1, 87, 271, 84, 201] + list(range(5, 5 + n)) for n in (1, 7, 3)]  # unequal lengths
    gen = GenerationConfig(max_new_tokens=6, do_sample=False, eos_token_id=sorted(target.eos_token_ids),
                           pad_token_id=target.tokenizer.pad_token_id)
    batched = generate_batched(target, prompts, gen, batch_size=3, progress=False)
    for prompt, reply in zip(prompts, batched.replies):
        alone = generate_batched(target, [prompt], gen, batch_size=1, progress=False).replies[0]
        assert reply == alone
    assert batched.new_tokens == sum(len(r) for r in batched.replies) > 0


def test_prompt_sampling_is_seeded_distinct_and_well_formed(target):
    cfg = small_config()
    first = sample_prompts(target, cfg, wanted=6, progress=False)
    again = sample_prompts(target, cfg, wanted=6, progress=False)
    other = sample_prompts(target, small_config(seed=1), wanted=6, progress=False)
    assert first.prompts == again.prompts
    assert first.prompts != other.prompts
    assert len(first.prompts) == 6 <= first.samples
    assert len({" ".join(p.split()).casefold() for p in first.prompts}) == 6
    assert all(p == p.strip() and p for p in first.prompts)
    specials = target.tokenizer.all_special_tokens
    assert not any(s in p for p in first.prompts for s in specials)


def test_sampling_drops_truncated_empty_malformed_and_duplicate_turns(target, monkeypatch):
    tok, eos = target.tokenizer, target.tokenizer.eos_token_id
    hello, world = tokenize(tok, "hello"), tokenize(tok, "the world")
    replies = [hello,  # truncated: no end-of-turn
               [eos],  # empty
               hello + [tok.convert_tokens_to_ids("<|im_start|>")] + hello + [eos],  # a new turn inside
               hello + [eos],  # kept
               tokenize(tok, " HELLO ") + [eos],  # a duplicate up to case and spaces
               world + [eos]]  # kept
    seen_prompts = []

    def fake_generate(target, prompts, gen, batch_size, desc="", progress=True):
        seen_prompts.extend(prompts)
        return Generated(replies[: len(prompts)], [r[-1] == eos for r in replies[: len(prompts)]], 1, 0.1)

    monkeypatch.setattr(self_distill, "generate_batched", fake_generate)
    cfg = small_config(gen_batch_size=6, prompt_sampling_budget=1.0, system_prompts=["A", "B"])
    out = sample_prompts(target, cfg, wanted=6, progress=False)
    assert out.prompts == ["hello", "the world"]
    assert out.samples == 6
    # System prompts are cycled across the samples of a batch.
    expected = [tokenize(tok, user_turn_prefix(tok, s)) for s in ["A", "B"] * 3]
    assert seen_prompts == expected


def test_responses_are_the_targets_greedy_continuations(target):
    cfg = small_config(max_response_tokens=10)
    examples, out = distill_responses(target, cfg, ["def add(a, b):", "What is the capital of France?"],
                                      progress=False)
    for example, reply in zip(examples, out.replies):
        ids = torch.tensor([example.input_ids])
        start = example.loss_mask.index(1)
        assert example.loss_mask == [0] * start + [1] * len(reply)
        assert example.input_ids[start:] == reply
        logits = target(ids).logits[0]  # [T, V]
        # Teacher-forced argmax at each position before a reply token is that token.
        assert logits[start - 1 : -1].argmax(-1).tolist() == reply
        assert len(reply) == cfg.max_response_tokens or reply[-1] in target.eos_token_ids


def test_the_machine_chooses_the_generation_batch_where_the_config_leaves_it_to_it():
    from types import SimpleNamespace

    from speclab.speculator.runtime.wide_gemm import WideChoice
    from speclab.training.self_distill import NATIVE_GEN_BATCH, WIDE_GEN_BATCH, generation_batch_size

    def target(wide):
        return SimpleNamespace(lean=None if wide is None else SimpleNamespace(wide=wide))

    auto = small_config(gen_batch_size=0)
    assert generation_batch_size(target(WideChoice(32, 64)), auto) == WIDE_GEN_BATCH  # layers run wide: AMX
    for narrow in (WideChoice(32, None), WideChoice(), None):  # head only, native only, the hf runtime
        assert generation_batch_size(target(narrow), auto) == NATIVE_GEN_BATCH
    assert generation_batch_size(target(WideChoice(32, 64)), small_config(gen_batch_size=8)) == 8
    with pytest.raises(ValueError, match="gen_batch_size"):
        small_config(gen_batch_size=-1)
