"""Verification: greedy on hand-made logits whose argmax we choose; rejection sampling on
small vocabularies where the exact distributions are known, checked statistically."""

import pytest
import torch

from speclab.kernels.verify import (VALID_MODES, greedy_tokens, reference, verify, verify_greedy, verify_sample,
                                   warp_logits)
from stat_checks import chi2_pvalue  # tests/stat_checks.py, shared with the eval tests

VOCAB = 11


def logits_choosing(choices: list[list[int]], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Random logits [B, k+1, V] whose argmax at [b, i] is choices[b][i]."""
    chosen = torch.tensor(choices)  # [B, k+1]
    logits = torch.randn(*chosen.shape, VOCAB, generator=torch.Generator().manual_seed(0))
    # Strictly above every random entry, so the argmax is the chosen token and never a tie.
    logits.scatter_(2, chosen.unsqueeze(-1), logits.abs().max().item() + 1.0)
    return logits.to(dtype)


def run(drafts: list[list[int]], choices: list[list[int]]) -> tuple[list[int], list[int]]:
    n, next_token = verify_greedy(torch.tensor(drafts), logits_choosing(choices))
    assert n.dtype == next_token.dtype == torch.long
    return n.tolist(), next_token.tolist()


def test_all_drafts_accepted_takes_the_bonus_token():
    assert run([[3, 5, 7, 2]], [[3, 5, 7, 2, 9]]) == ([4], [9])


def test_first_draft_rejected_takes_the_targets_token():
    assert run([[4, 5, 7, 2]], [[3, 5, 7, 2, 9]]) == ([0], [3])


def test_agreement_after_a_rejection_does_not_count():
    # d_3 is wrong, d_4 agrees again: only the leading run (2) is accepted.
    assert run([[3, 5, 1, 2]], [[3, 5, 7, 2, 9]]) == ([2], [7])


def test_batch_rows_accept_different_counts():
    drafts = [[3, 5, 7], [3, 5, 7], [0, 5, 7], [3, 1, 7]]
    choices = [[3, 5, 7, 8], [3, 5, 6, 8], [3, 5, 7, 8], [3, 5, 7, 8]]
    assert run(drafts, choices) == ([3, 2, 0, 1], [8, 6, 3, 5])


def test_no_drafts_gives_the_targets_next_token():
    n, next_token = verify_greedy(torch.empty(2, 0, dtype=torch.long), logits_choosing([[4], [6]]))
    assert n.tolist() == [0, 0] and next_token.tolist() == [4, 6]


def test_bf16_logits():
    n, next_token = verify_greedy(torch.tensor([[3, 5, 1]]), logits_choosing([[3, 5, 7, 2]], torch.bfloat16))
    assert n.tolist() == [2] and next_token.tolist() == [7]


def test_runs_without_host_sync_on_meta_tensors():
    # Meta tensors carry shapes but no data: any .item()/.tolist() inside would raise.
    drafts = torch.zeros(3, 4, dtype=torch.long, device="meta")
    n, next_token = verify_greedy(drafts, torch.empty(3, 5, VOCAB, device="meta"))
    assert n.shape == next_token.shape == (3,)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_tokens_is_argmax_on_ties_nan_and_infinities(dtype):
    # Few distinct values over a wide row: most rows tie, several times, at their maximum.
    logits = torch.randint(0, 3, (64, 5, 4099), generator=torch.Generator().manual_seed(1)).to(dtype)
    logits[0, 0, [17, 4000]] = float("nan")  # NaN counts as the maximum, the first one wins
    logits[1, 1, [9, 3000]] = float("inf")
    logits[2, 2] = float("-inf")  # nothing above -inf: index 0
    assert torch.equal(greedy_tokens(logits), logits.argmax(dim=-1))
    assert greedy_tokens(logits)[:3].diagonal().tolist() == [17, 9, 0]


@pytest.mark.parametrize(
    "draft_shape, logits_shape",
    [((1, 4), (1, 4, VOCAB)), ((2, 4), (1, 5, VOCAB)), ((4,), (1, 5, VOCAB)), ((1, 4), (1, 5))],
)
def test_rejects_mismatched_shapes(draft_shape, logits_shape):
    with pytest.raises(ValueError, match="k\\+1"):
        verify_greedy(torch.zeros(draft_shape, dtype=torch.long), torch.zeros(logits_shape))


def test_dispatch_greedy_matches_reference():
    drafts, logits = torch.tensor([[3, 5, 1], [3, 5, 7]]), logits_choosing([[3, 5, 7, 2], [3, 5, 7, 4]])
    for got, want in zip(verify(drafts, None, logits, mode="greedy"), verify_greedy(drafts, logits)):
        assert torch.equal(got, want)


def test_dispatch_names_valid_modes_for_unknown_mode():
    assert VALID_MODES == ("greedy", "sample")
    with pytest.raises(NotImplementedError, match="greedy, sample"):
        verify(torch.tensor([[1]]), None, logits_choosing([[1, 2]]), mode="rejection")


# --- rejection sampling -------------------------------------------------------------------

SMALL_V = 6
# Fixed, deliberately different target (p) and draft (q) distributions per position, each with
# a token the other gives zero mass, so clipping and residuals are both exercised.
P_ROWS = torch.tensor([[0.30, 0.25, 0.20, 0.15, 0.10, 0.00],
                       [0.05, 0.05, 0.40, 0.10, 0.20, 0.20],
                       [0.50, 0.10, 0.10, 0.10, 0.10, 0.10]])  # [k+1 = 3, V]
Q_ROWS = torch.tensor([[0.10, 0.10, 0.10, 0.30, 0.20, 0.20],
                       [0.30, 0.30, 0.10, 0.10, 0.20, 0.00]])  # [k = 2, V]


def sampled_tokens(n: int, seed: int, verify_fn=verify_sample) -> tuple[torch.Tensor, torch.Tensor]:
    """n independent verification rows on P_ROWS / Q_ROWS -> (n_accepted [n], next [n], drafts [n, k])."""
    gen = torch.Generator().manual_seed(seed)
    k = Q_ROWS.shape[0]
    drafts = torch.stack([torch.multinomial(Q_ROWS[i], n, replacement=True, generator=gen) for i in range(k)], 1)
    logits = P_ROWS.log().expand(n, -1, -1)  # log 0 = -inf: the warped logits' masked entries
    randoms = torch.rand(n, k + 1, generator=gen)
    n_acc, next_token = verify_fn(drafts, Q_ROWS.expand(n, -1, -1), logits, randoms)
    return n_acc, next_token, drafts


def committed_at(position: int, n_acc, next_token, drafts) -> tuple[torch.Tensor, torch.Tensor]:
    """The committed token at `position` (0-based) in rows that committed that many tokens -> (rows mask, tokens)."""
    has = n_acc >= position  # a step commits n + 1 tokens
    token = torch.where(n_acc > position, drafts[:, min(position, drafts.shape[1] - 1)], next_token)
    return has, token[has]

# 40k rows: a wrong rule below shifts some token's probability by >= 0.02, which at this
# size is a chi-squared statistic in the hundreds (p < 1e-20), while the correct rule passes
# a 1e-4 threshold with probability 0.9999 per seed; the seed is fixed, so the test is exact.
N_SAMPLES = 40_000
ALPHA = 1e-4


def check_follows_target(verify_fn) -> list[float]:
    n_acc, next_token, drafts = sampled_tokens(N_SAMPLES, seed=1234, verify_fn=verify_fn)
    # Position i's token, given the step reached it, must be distributed as p_i: the target's
    # logits here do not depend on the context, so each position is a fresh draw from P_ROWS[i].
    return [chi2_pvalue(committed_at(i, n_acc, next_token, drafts)[1], P_ROWS[i]) for i in range(3)]


def test_sampled_tokens_follow_the_target_distribution():
    pvalues = check_follows_target(verify_sample)
    assert min(pvalues) > ALPHA, pvalues


def _resample_from_p(p_n, q_n):
    return p_n


def _unclipped_residual(p_n, q_n):
    # Negative weights make the cumulative sum non-monotone, which the inverse CDF misreads.
    return p_n - q_n


def _accept_with_q_over_p(p_d, q_d, u):
    return u < torch.clamp(q_d / p_d, max=1.0)


def _accept_if_target_likes_it(p_d, q_d, u):
    return p_d > 0


@pytest.mark.parametrize(
    "name, replacement",
    [("recovery_weights", _resample_from_p), ("recovery_weights", _unclipped_residual),
     ("accept_mask", _accept_with_q_over_p), ("accept_mask", _accept_if_target_likes_it)],
)
def test_statistical_check_catches_a_wrong_rejection_rule(monkeypatch, name, replacement):
    # The same check as above must fail for each broken rule, or it proves nothing. (Accepting
    # with p/q unclipped is not among them: u < 1, so u < p/q and u < min(1, p/q) agree.)
    monkeypatch.setattr(reference, name, replacement)
    assert min(check_follows_target(verify_sample)) < ALPHA


def test_draft_equal_to_target_is_always_accepted():
    n_acc, _, _ = sampled_tokens(1000, seed=0, verify_fn=lambda d, q, t, r: verify_sample(
        d, q, torch.log(torch.cat([q, P_ROWS[2:].expand(q.shape[0], -1, -1)], 1)), r))
    assert (n_acc == 2).all()


def test_draft_the_target_never_produces_is_always_rejected():
    drafts = torch.tensor([[5, 0], [5, 5]])  # p_0(5) = 0
    n_acc, next_token = verify_sample(drafts, Q_ROWS.expand(2, -1, -1), P_ROWS.log().expand(2, -1, -1),
                                      torch.zeros(2, 3))
    # u = 0 picks the first token of the residual max(0, p_0 - q_0) = [.2, .15, .1, 0, 0, 0]/.45
    assert n_acc.tolist() == [0, 0] and next_token.tolist() == [0, 0]


def test_inverse_cdf_follows_index_order_and_skips_zero_weights():
    weights = torch.tensor([[0.0, 1.0, 0.0, 3.0, 0.0]]).expand(5, -1)
    u = torch.tensor([0.0, 0.2499, 0.25, 0.9999, 1.0 - 2**-24])
    assert reference.sample_inverse_cdf(weights, u).tolist() == [1, 1, 3, 3, 3]


def test_sample_mode_is_deterministic_given_randoms_and_seeded_without():
    n1, t1, _ = sampled_tokens(500, seed=7)
    n2, t2, _ = sampled_tokens(500, seed=7)
    assert torch.equal(n1, n2) and torch.equal(t1, t2)
    drafts, probs, logits = torch.tensor([[1, 2]]), Q_ROWS[None], P_ROWS.log()[None]
    runs = []
    for _ in range(2):
        torch.manual_seed(3)
        runs.append(verify(drafts, probs, logits, mode="sample"))
    assert all(torch.equal(a, b) for a, b in zip(*runs))


def test_sample_mode_runs_without_host_sync_on_meta_tensors():
    drafts = torch.zeros(3, 4, dtype=torch.long, device="meta")
    n, next_token = verify(drafts, torch.empty(3, 4, VOCAB, device="meta"), torch.empty(3, 5, VOCAB, device="meta"),
                           mode="sample", randoms=torch.empty(3, 5, device="meta"))
    assert n.shape == next_token.shape == (3,)


def test_sample_mode_checks_shapes():
    with pytest.raises(ValueError, match="draft_probs"):
        verify_sample(torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 2, 5), torch.zeros(1, 3, 6), torch.zeros(1, 3))
    with pytest.raises(ValueError, match="randoms"):
        verify_sample(torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 2, 6), torch.zeros(1, 3, 6), torch.zeros(1, 2))
    with pytest.raises(ValueError, match="draft_probs"):
        verify(torch.zeros(1, 2, dtype=torch.long), None, torch.zeros(1, 3, 6), mode="sample")


@pytest.mark.parametrize("temperature, top_k, top_p", [(0.7, 0, 1.0), (1.3, 5, 1.0), (1.0, 0, 0.8), (0.5, 7, 0.6),
                                                       (1.0, 1, 1.0), (1.0, 0, 0.01)])
def test_warp_logits_matches_transformers(temperature, top_k, top_p):
    from transformers.generation.logits_process import (TemperatureLogitsWarper, TopKLogitsWarper,
                                                        TopPLogitsWarper)

    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    want = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_k:
        want = TopKLogitsWarper(top_k)(None, want)
    if top_p < 1:
        want = TopPLogitsWarper(top_p)(None, want)
    got = warp_logits(logits, temperature, top_k, top_p)
    assert torch.equal(got.isinf(), want.isinf())
    # Same float32 division by the temperature on both sides: equal to the last bit.
    assert torch.equal(got[~got.isinf()], want[~want.isinf()])


def test_warp_logits_rejects_greedy_temperature():
    with pytest.raises(ValueError, match="temperature"):
        warp_logits(torch.zeros(1, 3), 0.0)
