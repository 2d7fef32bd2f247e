"""Fused linear + distillation loss: the Triton kernel and the chunked reference against an
fp64 unfused computation, value and gradient, in named regimes.

On CPU the kernel runs under TRITON_INTERPRET=1 (tests/kernels/conftest.py) with small
shapes; where CUDA exists the same tests run the compiled kernel with large ones.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from speclab.kernels.distill_loss import distill_loss, distill_loss_naive

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
# (N, D, H, V, chunk): odd sizes, several chunks and a ragged last one. On CPU the chunk (the
# Triton tile BLOCK_V) is small so that 301 columns span 5 tiles, the last holding 45.
ODD = (1823, 781, 579, 32003, None) if ON_GPU else (37, 45, 29, 301, 64)
# >= 49,152 columns, so that the last tile is the ragged tail of a real-size vocabulary.
LARGE_V = (257, 576, 576, 49157, None) if ON_GPU else (5, 16, 24, 49157, 2048)
BACKENDS = ["triton", "reference"]


def make_inputs(N, D, H, V, dtype=torch.float32, seed=0, spread=3.0):
    """Draft and target hidden states and heads whose logits have std ~`spread`."""
    g = torch.Generator().manual_seed(seed)
    hd = torch.randn(N, D, generator=g, dtype=torch.float64)
    wd = torch.randn(V, D, generator=g, dtype=torch.float64) * spread / D**0.5
    ht = torch.randn(N, H, generator=g, dtype=torch.float64)
    wt = torch.randn(V, H, generator=g, dtype=torch.float64) * spread / H**0.5
    return [x.to(dtype) for x in (hd, wd, ht, wt)]


def saturate(h: torch.Tensor, w: torch.Tensor, rows: slice, column: int, gap: float = 60.0) -> None:
    """Make logit `column` of `rows` exceed the rest by ~gap: p there is 1 - O(e^-gap)."""
    h[rows, 0] = 1.0
    w[:, 0] = 0.0
    w[column, 0] = gap


def fp64_truth(hd, wd, ht, wt, kind, gamma):
    """Unfused loss and gradients in float64 from the same (possibly bf16-rounded) inputs."""
    hd64 = hd.detach().double().requires_grad_()
    wd64 = wd.detach().double().requires_grad_()
    z, t = hd64 @ wd64.T, ht.double() @ wt.double().T
    log_q = F.log_softmax(z, -1)
    if kind == "kl":
        log_p = F.log_softmax(t, -1)
        loss = (log_p.exp() * (log_p - log_q)).sum(-1)
    else:
        loss = -log_q.gather(1, t.argmax(-1, keepdim=True)).squeeze(1)
    (loss * gamma.double()).sum().backward()
    return loss.detach(), hd64.grad, wd64.grad, z.argmax(-1), t.argmax(-1)


def run(backend, hd, wd, ht, wt, kind, gamma, chunk, mask=None):
    hd, wd = hd.to(DEVICE).requires_grad_(), wd.to(DEVICE).requires_grad_()
    out = distill_loss(hd, wd, ht.to(DEVICE), wt.to(DEVICE), kind, mask=mask, chunk_size=chunk, backend=backend)
    (out.loss * gamma.to(DEVICE)).sum().backward()
    return out.loss.detach().cpu(), hd.grad.cpu(), wd.grad.cpu(), out.draft_argmax.cpu(), out.target_argmax.cpu()


def assert_matches_fp64(got, want, *, rtol: float, atol: float, what: str) -> None:
    """The numerical check: first no NaN/Inf, then closeness to the fp64 truth."""
    bad = ~torch.isfinite(got)
    assert not bad.any(), f"{what}: {int(bad.sum())} NaN/Inf entries, first at {bad.nonzero()[0].tolist()}"
    torch.testing.assert_close(got.double(), want, rtol=rtol, atol=atol, msg=lambda m: f"{what}: {m}")


def check(got, truth, dtype):
    loss, grad_h, grad_w, arg_z, arg_t = got
    # Loss: fp32 logits from exact (fp32 or bf16-rounded) inputs, accumulated over <= 781
    # products, err ~1e-6 relative on logits of size ~3-60; the online lse adds a few ulps per
    # chunk. 2e-5 is ~50x that yet below the ~1/V effect (>= 2e-5 here, logits spread 3) of
    # dropping or double-counting one column: test_tolerance_catches_an_off_by_one_column.
    assert_matches_fp64(loss, truth[0], rtol=2e-5, atol=2e-5, what="loss")
    if dtype == torch.float32:
        # fp32 gradients: sums of V terms gamma (q - p) w, each exact to ~1e-7 relative.
        grad_tol = dict(rtol=1e-4, atol=1e-5 * float(truth[1].abs().max()))
    else:
        # bf16 gradients are rounded to bf16 on return (2^-8 relative); on a GPU the tile of
        # gamma (q - p) is also rounded to bf16 before the tensor-core dot, which adds up to
        # another 2^-8 of the largest entry: 2e-2 covers both with margin, 1e-1 would not be tight.
        grad_tol = dict(rtol=2e-2, atol=2e-2 * float(truth[1].abs().max()))
    assert_matches_fp64(grad_h, truth[1], **grad_tol, what="grad draft hidden")
    if dtype != torch.float32:
        grad_tol["atol"] = 2e-2 * float(truth[2].abs().max())
    else:
        grad_tol["atol"] = 1e-5 * float(truth[2].abs().max())
    assert_matches_fp64(grad_w, truth[2], **grad_tol, what="grad draft head")
    # Argmaxes: exact, except where the fp64 top two are closer than the fp32 rounding.
    assert (arg_z == truth[3]).float().mean() >= 0.99
    assert torch.equal(arg_t, truth[4]) or (arg_t == truth[4]).float().mean() >= 0.99


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["kl", "ce"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_odd_shapes(backend, kind, dtype):
    N, D, H, V, chunk = ODD
    inputs = make_inputs(N, D, H, V, dtype)
    gamma = torch.rand(N, generator=torch.Generator().manual_seed(1)) + 0.5  # non-uniform upstream grads
    check(run(backend, *inputs, kind, gamma, chunk), fp64_truth(*inputs, kind, gamma), dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["kl", "ce"])
def test_saturated_rows(backend, kind):
    """One logit ~60 above the rest: exp underflows everywhere else, so a naive (non-online)
    softmax or a max taken in the wrong chunk shows up as NaN/Inf or a wrong lse."""
    N, D, H, V, chunk = ODD
    hd, wd, ht, wt = make_inputs(N, D, H, V)
    half = slice(0, N // 2)
    saturate(ht, wt, half, column=V - 1)  # target sure of the last column (in the ragged tile)
    saturate(hd, wd, half, column=3)  # draft sure of another, in the first tile: KL ~ 60
    gamma = torch.ones(N)
    truth = fp64_truth(hd, wd, ht, wt, kind, gamma)
    assert truth[0][half].min() > 50  # the regime is what it says: huge, saturated losses
    check(run(backend, hd, wd, ht, wt, kind, gamma, chunk), truth, torch.float32)


@pytest.mark.parametrize("backend", BACKENDS)
def test_tail_of_a_large_vocabulary(backend):
    N, D, H, V, chunk = LARGE_V
    hd, wd, ht, wt = make_inputs(N, D, H, V)
    saturate(ht, wt, slice(0, 2), column=V - 2, gap=12.0)  # the target's mode in the ragged tail tile
    gamma = torch.ones(N)
    truth = fp64_truth(hd, wd, ht, wt, "kl", gamma)
    assert (truth[4][:2] == V - 2).all()
    check(run(backend, hd, wd, ht, wt, "kl", gamma, chunk), truth, torch.float32)


@pytest.mark.parametrize("backend", BACKENDS)
def test_masked_rows_carry_no_loss_and_no_gradient(backend):
    N, D, H, V, chunk = ODD
    hd, wd, ht, wt = make_inputs(N, D, H, V)
    mask = torch.arange(N) % 3 != 0
    got = run(backend, hd, wd, ht, wt, "kl", torch.ones(N), chunk, mask=mask.to(DEVICE))
    assert (got[0][~mask] == 0).all() and (got[1][~mask] == 0).all()
    # The unmasked rows are trained exactly as if the masked ones were absent.
    truth = fp64_truth(hd[mask], wd, ht[mask], wt, "kl", torch.ones(int(mask.sum())))
    check((got[0][mask], got[1][mask], got[2], got[3][mask], got[4][mask]), truth, torch.float32)


def test_tolerance_catches_an_off_by_one_column():
    """The loss tolerance of `check` is tight enough to see one column dropped at a chunk edge."""
    N, D, H, V, chunk = ODD
    hd, wd, ht, wt = make_inputs(N, D, H, V)
    gamma = torch.ones(N)
    truth = fp64_truth(hd, wd, ht, wt, "kl", gamma)
    for dropped in (63, 64, V - 1):  # either side of the first tile edge, and the very last column
        keep = torch.arange(V) != dropped
        off = fp64_truth(hd, wd[keep], ht, wt[keep], "kl", gamma)[0]
        with pytest.raises(AssertionError):
            assert_matches_fp64(off.float(), truth[0], rtol=2e-5, atol=2e-5, what="off by one")


def test_numerical_check_flags_nan():
    with pytest.raises(AssertionError, match="NaN/Inf"):
        assert_matches_fp64(torch.tensor([1.0, float("nan")]), torch.ones(2, dtype=torch.float64),
                            rtol=0, atol=0, what="loss")


@pytest.mark.parametrize("kind", ["kl", "ce"])
def test_chunked_reference_matches_the_naive_unfused_loss(kind):
    """The CPU path is the unfused computation, chunking aside, at several chunk sizes."""
    hd, wd, ht, wt = make_inputs(23, 17, 19, 130)
    want = distill_loss_naive(hd, wd, ht, wt, kind)
    for chunk in (1, 7, 64, 130, 1000):
        got = distill_loss(hd, wd, ht, wt, kind, chunk_size=chunk, backend="reference")
        torch.testing.assert_close(got.loss, want[0], rtol=1e-5, atol=1e-5)  # fp32 vs fp32, reordered sums
        assert torch.equal(got.draft_argmax, want[1]) and torch.equal(got.target_argmax, want[2])


def test_argmax_ties_take_the_first_index_across_chunks():
    hd, wd, ht, wt = make_inputs(2, 4, 4, 40)
    wd[[5, 25]] = wd[30] = 10 * hd[0] / hd[0].norm()  # row 0: three-way tie, in chunks 0, 2 and 3
    for backend in BACKENDS:
        out = distill_loss(hd.to(DEVICE), wd.to(DEVICE), ht.to(DEVICE), wt.to(DEVICE), chunk_size=16, backend=backend)
        assert int(out.draft_argmax[0]) == 5


def test_mismatched_vocabularies_are_an_error():
    hd, wd, ht, wt = make_inputs(3, 4, 4, 40)
    with pytest.raises(ValueError, match="same vocabulary"):
        distill_loss(hd, wd, ht, wt[:39])
