"""The fused forward KL of training (kernels/forward_kl.py) against torch's unfused passes:
loss, gradient and both argmaxes, for every CPU build the tests can make."""

import pytest
import torch

from speclab.kernels import native
from speclab.kernels.forward_kl import forward_kl_rows, forward_kl_torch

BUILDS = [pytest.param(march, marks=pytest.mark.skipif(native.load(march) is None, reason=f"no {march} build here"))
          for march in ("native", "haswell")]


def _case(n: int, v: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    draft, target = torch.randn(n, v, generator=g) * 4, torch.randn(n, v, generator=g) * 4
    # Ties: the first index wins, in one vector lane (32 apart), across lanes and the tail, and
    # at a row's start.
    draft[0, 1] = draft[0, 33 % v] = 60.0
    draft[-1, v // 2] = draft[-1, v - 1] = 60.0
    target[-1, 1] = target[-1, 0] = 60.0
    return draft, target


def _run(fn, draft, target, dtype, **kw):
    leaf = draft.to(dtype).clone().requires_grad_()
    loss, d_arg, t_arg = fn(leaf, target, **kw)
    weights = torch.linspace(0.5, 1.5, len(loss))  # a non-uniform upstream gradient
    (loss * weights).sum().backward()
    return loss.detach(), d_arg, t_arg, leaf.grad.float()


@pytest.mark.parametrize("march", BUILDS)
@pytest.mark.parametrize("n, v", [(37, 1001), (6, 64), (3, 5), (64, 8192)])  # tails, whole vectors, V < a vector
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fused_kl_matches_torch(march, n, v, dtype):
    draft, target = _case(n, v, seed=n + v)
    ref = _run(forward_kl_torch, draft, target, dtype)
    got = _run(forward_kl_rows, draft, target, dtype, lib=native.load(march))
    assert torch.equal(got[1], ref[1]) and torch.equal(got[2], ref[2])
    assert (got[1][0], got[1][-1], got[2][-1]) == (1, v // 2, 0)
    torch.testing.assert_close(got[0], ref[0], rtol=1e-5, atol=2e-5)
    # fp32: the gradient q - p to float rounding; bf16: both rounded to the draft's bf16
    tol = dict(rtol=1e-4, atol=1e-7) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-6)
    torch.testing.assert_close(got[3], ref[3], **tol)
    assert ref[3].abs().max() > 1e-3  # the comparison sees real gradients


def test_identical_distributions_cost_nothing_and_shifted_logits_are_the_same_distribution():
    g = torch.Generator().manual_seed(0)
    target = torch.randn(4, 300, generator=g) * 3
    loss, *_ = forward_kl_rows(target + 7.5, target)  # softmax ignores a constant shift
    assert loss.abs().max() < 1e-5
    loss, *_ = forward_kl_rows(torch.zeros(4, 300), target)
    assert (loss > 0.5).all()


@pytest.mark.parametrize("march", BUILDS)
def test_target_rows_are_read_in_place(march):
    """Draft row n against target row target_rows[n]: a later draft step's subset, and a
    repeated row, give what the gathered rows give."""
    draft, target = _case(7, 300, seed=3)
    rows = torch.tensor([6, 0, 2, 2, 5, 1, 3])
    ref = _run(forward_kl_torch, draft, target[rows], torch.float32)
    got = _run(forward_kl_rows, draft, target, torch.float32, lib=native.load(march), target_rows=rows)
    assert torch.equal(got[1], ref[1]) and torch.equal(got[2], ref[2])
    torch.testing.assert_close(got[0], ref[0], rtol=1e-5, atol=2e-5)
    torch.testing.assert_close(got[3], ref[3], rtol=1e-4, atol=1e-7)
