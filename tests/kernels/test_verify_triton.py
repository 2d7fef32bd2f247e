"""The Triton verification kernel against the torch reference, decision for decision.

Given the same randoms, kernel and reference must take the same decisions: counts and tokens
are compared exactly (the only allowed difference, u within float rounding of a boundary, has
probability ~1e-7 per draw and does not occur with these seeds). On CPU the kernel runs under
TRITON_INTERPRET=1 (tests/kernels/conftest.py) with small shapes; with CUDA, large ones.
"""

from __future__ import annotations

import pytest
import torch

from speclab.kernels.verify import verify, verify_greedy, verify_sample, warp_logits
from speclab.kernels.verify.triton import verify_triton

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
# (B, k, V, tile): V odd so the last tile is ragged; on CPU 301 columns span 5 tiles of 64.
ODD = (64, 7, 32003, None) if ON_GPU else (5, 4, 301, 64)
LARGE_V = (8, 4, 128256, None) if ON_GPU else (2, 3, 49157, 4096)


def case(B, k, V, seed=0, agreement=0.8, dtype=torch.float32):
    """Target logits, a draft distribution near the target's (so runs of acceptances occur),
    drafts sampled from it, and the randoms."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, k + 1, V, generator=g) * 3
    noise = torch.randn(B, k, V, generator=g) * (1 - agreement) * 3
    q = torch.softmax(logits[:, :k] + noise, -1)
    drafts = torch.multinomial(q.reshape(-1, V), 1, generator=g).view(B, k)
    u = torch.rand(B, k + 1, generator=g)
    return drafts, q.to(dtype), logits.to(dtype), u


def both(mode, drafts, q, logits, u, tile):
    if mode == "greedy":
        want = verify_greedy(drafts, logits)
    else:
        want = verify_sample(drafts, q, logits, u)
    dev = [x.to(DEVICE) if x is not None else None for x in (drafts, q, logits, u)]
    got = verify_triton(dev[0], dev[1], dev[2], mode, dev[3], block_v=tile)
    return [g.cpu() for g in got], want


def assert_same(got, want):
    assert got[0].dtype == got[1].dtype == torch.long
    assert torch.equal(got[0], want[0]), f"n_accepted {got[0].tolist()} != {want[0].tolist()}"
    assert torch.equal(got[1], want[1]), f"next_token {got[1].tolist()} != {want[1].tolist()}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_greedy_odd_shapes(dtype):
    B, k, V, tile = ODD
    drafts, _, logits, _ = case(B, k, V, dtype=dtype)
    # Make drafts agree with the argmax for a random leading run per row: every n in 0..k occurs.
    choice = logits.argmax(-1)
    runs = torch.arange(B) % (k + 1)
    drafts = torch.where(torch.arange(k) < runs[:, None], choice[:, :k], (choice[:, :k] + 1) % V)
    got, want = both("greedy", drafts, None, logits, None, tile)
    assert sorted(set(want[0].tolist())) == sorted(set(runs.tolist()))
    assert_same(got, want)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("seed", range(3))
def test_sample_odd_shapes(dtype, seed):
    B, k, V, tile = ODD
    assert_same(*both("sample", *case(B, k, V, seed=seed, dtype=dtype), tile))


def test_sample_all_accepted_draws_the_bonus_from_the_last_row():
    B, k, V, tile = ODD
    drafts, q, logits, u = case(B, k, V, seed=5)
    u[:, :k] = 0.0  # u < p/q always holds for p > 0: every draft accepted
    got, want = both("sample", drafts, q, logits, u, tile)
    assert (want[0] == k).all()
    assert_same(got, want)


def test_sample_saturated_and_masked_rows():
    """Warped logits: top-k leaves -inf everywhere else; one row saturated (one token ~1)."""
    B, k, V, tile = ODD
    drafts, q, logits, u = case(B, k, V, seed=7)
    logits[0, :, V - 1] = 1e4  # saturated on the last column (ragged tile), p there is 1.0
    logits = warp_logits(logits, temperature=0.7, top_k=20)
    q = torch.softmax(warp_logits(torch.log(q), temperature=1.0, top_k=25), -1)
    drafts = torch.multinomial(q.reshape(-1, V), 1, generator=torch.Generator().manual_seed(1)).view(B, k)
    got, want = both("sample", drafts, q, logits, u, tile)
    assert want[1][0] == V - 1 or want[0][0] == k and drafts[0].eq(V - 1).all()
    assert_same(got, want)


def test_sample_q_zero_at_a_draft_is_accepted_and_nan_rejected():
    """p/q = inf accepts; 0/0 = NaN rejects, as the reference's clamp does."""
    B, k, V, tile = 2, 2, 100, 64
    drafts, q, logits, u = case(B, k, V, seed=3)
    q[0, 0, drafts[0, 0]] = 0.0  # p > 0, q = 0: accept
    logits[1, 0, drafts[1, 0]] = float("-inf")
    q[1, 0, drafts[1, 0]] = 0.0  # p = q = 0: reject
    got, want = both("sample", drafts, q, logits, u, tile)
    assert want[0][0] >= 1 and want[0][1] == 0
    assert_same(got, want)


@pytest.mark.parametrize("mode", ["greedy", "sample"])
def test_tail_of_a_large_vocabulary(mode):
    B, k, V, tile = LARGE_V
    drafts, q, logits, u = case(B, k, V, seed=11, agreement=0.95)
    logits[:, :, V - 3] += 40.0  # the mode in the ragged last tile: greedy picks it, sampling nearly always
    drafts[:, 0] = V - 3
    got, want = both(mode, drafts, q, logits, u, tile)
    assert (want[0] >= 1).all()
    assert_same(got, want)


@pytest.mark.skipif(not ON_GPU, reason="the interpreter runs one program per draw (minutes for 4000); on CPU the "
                    "decision-for-decision equality with the reference above covers the kernel")
def test_sample_recovered_tokens_follow_the_target_distribution():
    """Rejection sampling is lossless: the first committed token is distributed as p_0."""
    V, draws = 8, 4000
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 2, V, generator=g)
    q = torch.softmax(torch.randn(1, 1, V, generator=g), -1)
    drafts = torch.multinomial(q[0, 0], draws, replacement=True, generator=g).view(draws, 1)
    u = torch.rand(draws, 2, generator=g)
    args = [x.to(DEVICE) for x in (drafts, q.expand(draws, 1, V).contiguous(),
                                   logits.expand(draws, 2, V).contiguous(), u)]
    n, nxt = (x.cpu() for x in verify_triton(args[0], args[1], args[2], "sample", args[3], block_v=16))
    first = torch.where(n >= 1, drafts[:, 0], nxt)
    freq = torch.bincount(first, minlength=V).double() / draws
    p = torch.softmax(logits[0, 0].double(), -1)
    # 4000 draws: each frequency's std is <= sqrt(0.25 / 4000) = 0.008; 0.04 is 5 sigma.
    assert (freq - p).abs().max() < 0.04


def test_dispatch_uses_the_kernel_on_cuda_and_the_reference_elsewhere():
    drafts, q, logits, u = case(*ODD[:3], seed=2)
    dev = [x.to(DEVICE) for x in (drafts, q, logits, u)]
    for mode in ("greedy", "sample"):
        got = verify(dev[0], dev[1], dev[2], mode=mode, randoms=dev[3])
        want = verify_sample(drafts, q, logits, u) if mode == "sample" else verify_greedy(drafts, logits)
        assert_same([g.cpu() for g in got], want)


def test_rejects_missing_sample_inputs():
    drafts, q, logits, _ = case(1, 2, 10)
    with pytest.raises(ValueError, match="randoms"):
        verify_triton(drafts, q, logits, "sample", None)
