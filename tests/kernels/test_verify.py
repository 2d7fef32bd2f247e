"""Greedy verification on hand-made logits whose argmax we choose."""

import pytest
import torch

from speclab.kernels.verify import VALID_MODES, verify, verify_greedy

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
    assert VALID_MODES == ("greedy",)
    with pytest.raises(NotImplementedError, match="greedy"):
        verify(torch.tensor([[1]]), None, logits_choosing([[1, 2]]), mode="rejection")
