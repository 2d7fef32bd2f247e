"""The lossless gate: numerical ties pass, wrong tokens fail, in fp32 and in bf16."""

import pytest
import torch

from speclab.eval import benchmark, lossless
from speclab.eval.benchmark import score
from speclab.eval.lossless import FP32_TOLERANCE, HALF_TOLERANCE, classify, first_divergence, tie_tolerance
from speclab.speculator.base import TargetInfo
from speclab.speculator.families import build_speculator
from speclab.speculator.target.builders import tiny_llama
from speculator_stubs import NeverSpeculator, scripted

MAX_NEW, K = 10, 3


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2


def test_tolerance_follows_the_arithmetic():
    assert tie_tolerance(tiny_llama(dtype="bf16")) == FP32_TOLERANCE  # lean: fp32 maths on bf16 weights
    assert tie_tolerance(tiny_llama(dtype="bf16", runtime="hf")) == HALF_TOLERANCE
    assert tie_tolerance(tiny_llama(runtime="hf")) == FP32_TOLERANCE


def test_near_equal_logits_are_a_tie_and_far_ones_a_mismatch(monkeypatch):
    target = tiny_llama(dtype="bf16", runtime="hf")
    prompt = torch.tensor([[5, 6, 7]])
    logits = torch.zeros(target.vocab_size)
    logits[10], logits[11], logits[12] = 20.0, 20.0 - HALF_TOLERANCE / 2, 20.0 - 3 * HALF_TOLERANCE
    monkeypatch.setattr(lossless, "fp32_logits", lambda target, ids: logits)
    tie = classify(target, prompt, [4, 10, 9], [4, 11, 3])
    assert tie["verdict"] == "tie" and tie["position"] == 1 and tie["tokens"] == [10, 11]
    assert classify(target, prompt, [4, 10], [4, 12])["verdict"] == "mismatch"
    assert classify(target, prompt, [4, 10], [4])["verdict"] == "mismatch"  # ended early


@pytest.mark.parametrize("dtype, runtime", [("fp32", "lean"), ("bf16", "lean"), ("bf16", "hf")])
def test_a_wrong_acceptance_rule_fails_in_every_dtype(dtype, runtime, monkeypatch):
    """Accept every draft whatever the target says: the committed drafts are tokens the
    target ranks far below its choice, so the gate calls them mismatches, bf16 included."""
    target = tiny_llama(dtype=dtype, runtime=runtime)
    prompts = [torch.tensor([[3, 14, 15, 92]]), torch.tensor([[6, 5, 35]])]
    from speclab.eval import engine

    def accept_all(drafts, q, logits, **kwargs):
        k = drafts.shape[1]
        return torch.tensor([k]), logits[:, k].argmax(-1)

    monkeypatch.setattr(engine, "verify", accept_all)
    torch.manual_seed(0)
    speculator = build_speculator("mlp", {}, TargetInfo.of(target)).to(target.dtype)  # untrained: random drafts
    result = score(target, speculator, prompts, MAX_NEW, K, progress=False)
    assert result["lossless"]["mismatches"] == 2 and result["lossless"]["ties"] == 0
    assert all(row["divergence"]["gap"] > tie_tolerance(target) for row in result["per_prompt"])


@pytest.mark.parametrize("dtype, runtime", [("fp32", "lean"), ("bf16", "lean"), ("bf16", "hf")])
def test_the_real_acceptance_rule_passes_in_every_dtype(dtype, runtime):
    target = tiny_llama(dtype=dtype, runtime=runtime)
    prompts = [torch.tensor([[3, 14, 15, 92]]), torch.tensor([[6, 5, 35]])]
    speculator = scripted(NeverSpeculator, target, prompts, MAX_NEW + K)
    result = score(target, speculator, prompts, MAX_NEW, K, progress=False)
    assert result["lossless"]["mismatches"] == 0
