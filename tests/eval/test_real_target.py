"""One brief check on the real SmolLM2 target: speculative output equals plain output."""

import pytest

from speclab.eval.engine import generate_plain, generate_speculative
from speclab.eval.metrics import AcceptanceStats
from speclab.eval.prompts import encode_prompt, humaneval_prompts
from speculator_stubs import NeverSpeculator, OracleSpeculator, scripted

MAX_NEW, K = 12, 4

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def target():
    from speclab.speculator.target.builders import smollm2_from_gguf

    return smollm2_from_gguf()


@pytest.fixture(scope="module")
def prompt(target):
    return encode_prompt(target.tokenizer, humaneval_prompts(limit=1)[0])


@pytest.fixture(scope="module")
def plain(target, prompt):
    return generate_plain(target, prompt, MAX_NEW, eos_ids=())


@pytest.mark.parametrize("cls, rate", [(OracleSpeculator, 1.0), (NeverSpeculator, 0.0)], ids=["oracle", "never"])
def test_speculative_equals_plain_on_smollm2(target, prompt, plain, cls, rate):
    stats = AcceptanceStats(K)
    speculator = scripted(cls, target, [prompt], MAX_NEW + K)
    spec = generate_speculative(target, speculator, prompt, MAX_NEW, K, eos_ids=(), stats=stats)
    assert spec.tokens == plain.tokens
    assert stats.acceptance_rate == rate


@pytest.mark.parametrize("family", ["mlp", "draft_lm"])
def test_real_families_are_lossless_on_two_humaneval_prompts(target, family):
    """Greedy speculative decoding with each real (untrained, seeded) family equals plain
    greedy decoding token for token on two HumanEval prompts."""
    import torch

    from speclab.speculator.base import TargetInfo
    from speclab.speculator.families import build_speculator

    torch.manual_seed(0)
    speculator = build_speculator(family, {"draft_vocab_size": 0}, TargetInfo.of(target)).eval()  # the whole vocabulary: no counts here
    for item in humaneval_prompts(limit=2):
        ids = encode_prompt(target.tokenizer, item)
        plain_out = generate_plain(target, ids, 16)
        stats = AcceptanceStats(K)
        spec = generate_speculative(target, speculator, ids, 16, K, stats=stats)
        assert spec.tokens == plain_out.tokens
        assert stats.num_drafts > 0
