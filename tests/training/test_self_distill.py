import pytest
import torch
from transformers import GenerationConfig

from speclab.speculator.target.builders import tiny_llama
from speclab.training import self_distill
from speclab.training.data_config import DataConfig
from speclab.training.data_tokenize import tokenize, user_turn_prefix
from speclab.training.self_distill import (
    DRAW_MARGIN, SAMPLE_SLICE, Generated, _chooser, _draws_for, distill_responses, generate_batched, sample_prompts)


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


def test_later_draws_are_sized_by_the_yield_of_the_earlier_ones(target, monkeypatch):
    tok, eos = target.tokenizer, target.tokenizer.eos_token_id
    made = []

    def fake_generate(target, prompts, gen, batch_size, desc="", progress=True):
        # Every other turn is truncated (no end-of-turn token): a yield of one half.
        replies = [tokenize(tok, f"question {len(made) + i}") + ([eos] if (len(made) + i) % 2 else [])
                   for i in range(len(prompts))]
        made.extend(replies)
        return Generated(replies, [r[-1] == eos for r in replies], 1, 0.1)

    monkeypatch.setattr(self_distill, "generate_batched", fake_generate)
    out = sample_prompts(target, small_config(gen_batch_size=8), wanted=6, progress=False)
    assert len(out.prompts) == 6
    # A whole batch of 8 kept 4; the 2 missing at a yield of 1/2, with the margin: 5, not 8.
    assert out.samples == 8 + 5 == 8 + _draws_for(2, 4, 8, 8)
    assert _draws_for(35, 77, 128, 128) == 67 == -(-35 * 128 * DRAW_MARGIN // 77)
    assert _draws_for(5, 0, 128, 128) == 128  # nothing kept yet: no yield to size by


def test_the_sampling_chooser_draws_each_row_from_its_own_warped_distribution():
    sample = _chooser(GenerationConfig(do_sample=True, temperature=1.0, top_k=2, top_p=1.0))
    rows = 3 * SAMPLE_SLICE + 5  # rows in several slices, the last one short
    point_masses = torch.full((rows, 50), -1e4)
    expected = torch.arange(rows) * 7 % 50
    point_masses[torch.arange(rows), expected] = 0.0
    assert torch.equal(sample(point_masses), expected)  # each row's own token: no slice misaligned

    torch.manual_seed(0)
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0]]).expand(20_000, 4)
    counts = torch.bincount(sample(logits), minlength=4) / 20_000
    top2 = torch.softmax(torch.tensor([2.0, 1.0]), -1)
    assert counts[2:].sum() == 0  # outside top-k: never drawn
    torch.testing.assert_close(counts[:2], top2, atol=0.015, rtol=0)  # ~5 sigma at 20k draws
    torch.manual_seed(3)
    first = sample(logits[:64])
    torch.manual_seed(3)
    assert torch.equal(sample(logits[:64]), first)  # seeded: repeatable
    assert torch.equal(_chooser(GenerationConfig(do_sample=False))(logits[:2]), torch.tensor([0, 0]))


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

    from speclab.kernels.native.wide_gemm import WideChoice
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
