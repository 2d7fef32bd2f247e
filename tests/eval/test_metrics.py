"""AcceptanceStats against counts worked out by hand."""

import pytest

from speclab.eval.metrics import AcceptanceStats


def stats_after(k: int, accepted: list[int]) -> AcceptanceStats:
    stats = AcceptanceStats(k)
    for n in accepted:
        stats.update(n)
    return stats


def test_counts_and_rates():
    stats = stats_after(4, [4, 0, 2])
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (3, 12, 6)
    assert stats.accepted_per_position == [2, 2, 1, 1]
    assert stats.acceptance_rate == pytest.approx(6 / 12)
    assert stats.mean_acceptance_length == pytest.approx(1 + 6 / 3)
    assert stats.per_position == pytest.approx([2 / 3, 2 / 3, 1 / 3, 1 / 3])


def test_to_dict_holds_exactly_the_result_fields():
    d = stats_after(2, [1, 2]).to_dict()
    assert d == {
        "k": 2,
        "num_drafts": 2,
        "num_draft_tokens": 4,
        "num_accepted_tokens": 3,
        "acceptance_rate": pytest.approx(0.75),
        "mean_acceptance_length": pytest.approx(2.5),
        "per_position": pytest.approx([1.0, 0.5]),
    }


def test_empty_stats_are_finite():
    stats = AcceptanceStats(3)
    assert (stats.acceptance_rate, stats.mean_acceptance_length, stats.per_position) == (0.0, 1.0, [0.0] * 3)


def test_merge_equals_one_stream():
    merged = stats_after(3, [3, 1]).merge(stats_after(3, [0, 2, 3]))
    assert merged == stats_after(3, [3, 1, 0, 2, 3])


def test_merge_rejects_another_k():
    with pytest.raises(ValueError, match="k=2"):
        AcceptanceStats(3).merge(AcceptanceStats(2))


@pytest.mark.parametrize("n", [-1, 4])
def test_update_rejects_counts_outside_0_to_k(n):
    with pytest.raises(ValueError, match="\\[0, 3\\]"):
        AcceptanceStats(3).update(n)


def test_k_must_be_positive():
    with pytest.raises(ValueError, match=">= 1"):
        AcceptanceStats(0)
