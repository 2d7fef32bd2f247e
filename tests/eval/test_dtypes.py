"""Every family decodes in the dtype it is handed, whatever dtype and runtime the target
computes in: no dtype error anywhere, and greedy output still equals plain decoding."""

import pytest
import torch

from speclab.eval.engine import generate_plain, generate_speculative
from speclab.eval.tree import TreeConfig, generate_tree
from speclab.speculator.base import TargetInfo
from speclab.speculator.families import REGISTRY, build_speculator
from speclab.speculator.target.builders import tiny_llama

FAMILIES = sorted(REGISTRY)
PROMPT = torch.tensor([[3, 14, 15, 92, 65]])


@pytest.fixture(scope="module", params=[("bf16", "lean"), ("bf16", "hf"), ("fp32", "lean")], ids=str)
def target(request):
    dtype, runtime = request.param
    return tiny_llama(dtype=dtype, runtime=runtime)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("speculator_dtype", [torch.float32, torch.bfloat16], ids=["spec-fp32", "spec-bf16"])
def test_family_runs_in_its_own_dtype(target, family, speculator_dtype):
    torch.manual_seed(0)
    plain = generate_plain(target, PROMPT, 12)
    speculator = build_speculator(family, {}, TargetInfo.of(target))
    if speculator.training_data_tokens():  # the hybrid's suffix corpus: one right answer, one that diverges
        speculator.use_training_data([plain.tokens, plain.tokens[:4] + [7, 8, 9, 10]])
        assert speculator.corpus_report()["tokens"] > 0
    speculator = speculator.to(speculator_dtype).eval()  # integer corpus buffers keep their dtype
    chain = generate_speculative(target, speculator, PROMPT, 12, 3)
    assert chain.tokens == plain.tokens
    union = generate_tree(target, speculator, PROMPT, 12, TreeConfig("union", depth=3, budget=5))
    assert union.tokens == plain.tokens  # the trie of its chains (the hybrid: both parts')
    try:
        tree = generate_tree(target, speculator, PROMPT, 12, TreeConfig(depth=2, top_k=2, budget=4))
    except NotImplementedError:  # families without tree drafting
        return
    assert tree.tokens == plain.tokens
