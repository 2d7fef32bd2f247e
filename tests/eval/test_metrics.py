"""AcceptanceStats against counts worked out by hand."""

import pytest

from speclab.eval.metrics import AcceptanceStats, RequestRecord, acceptance_conventions, bootstrap_ci, speedups, timing


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


# --- conventions, timing, bootstrap -------------------------------------------------------



def test_pooled_and_per_request_conventions_differ_as_defined():
    # Request A: 3 steps accepting 4, 4, 4; request B: 1 step accepting 0.
    records = [RequestRecord(15, 1.0, [4, 4, 4], 12), RequestRecord(1, 1.0, [0], 4)]
    c = acceptance_conventions(records, k=4)
    assert c["pooled_without_bonus"] == 12 / 4 and c["pooled_with_bonus"] == 1 + 12 / 4
    assert c["per_request_mean_without_bonus"] == (4 + 0) / 2 and c["per_request_mean_with_bonus"] == 3.0
    assert c["per_position"] == [0.75, 0.75, 0.75, 0.75]


def test_timing_per_step_and_per_drafted_token():
    records = [RequestRecord(10, 1.0, [1, 2], 8, draft_seconds=0.4, verify_seconds=0.6)]
    t = timing(records)
    assert t["draft_ms_per_step"] == pytest.approx(200.0) and t["verify_ms_per_step"] == pytest.approx(300.0)
    assert t["draft_ms_per_token"] == pytest.approx(50.0)


def test_speedup_conventions():
    # Spec-Bench: mean tok/s ratio (10 + 40) / (10 + 10) = 2.5; total: (10 + 40 tokens) / (1 + 1 s)
    # over (10 + 10) / (1 + 1) = 2.5 too here, but not when the times differ:
    method = [RequestRecord(10, 1.0), RequestRecord(40, 1.0)]
    base = [RequestRecord(10, 1.0), RequestRecord(10, 1.0)]
    assert speedups(method, base) == {"speedup_specbench": 2.5, "speedup_total": 2.5}
    method = [RequestRecord(10, 0.5), RequestRecord(40, 4.0)]
    s = speedups(method, base)
    assert s["speedup_specbench"] == pytest.approx((20 + 10) / 20) and s["speedup_total"] == pytest.approx(50 / 4.5 / 10)


def test_bootstrap_interval_brackets_the_estimate_and_shrinks_with_agreement():
    same = [RequestRecord(10, 1.0, [2, 2], 8)] * 8
    ci = bootstrap_ci(same, same, resamples=200)
    assert ci["acceptance_length"] == [3.0, 3.0] and ci["speedup_total"] == [1.0, 1.0]
    mixed = [RequestRecord(10, 1.0, [n], 4) for n in (0, 4) * 4]
    lo, hi = bootstrap_ci(mixed, None, resamples=500)["acceptance_length"]
    assert lo < 3.0 < hi and hi - lo > 0.5  # 1 + mean of {0, 4}: 3, with real spread


def test_tokens_per_pass_from_steps_or_from_counted_passes():
    from speclab.eval.metrics import tokens_per_pass

    assert tokens_per_pass([RequestRecord(9, 1.0, [3, 1], 8, passes=3)]) == 3.0  # 1 + 4 / 2 steps
    # A peer: 17 tokens in 5 passes (prefill + 4 verifications) -> 16 / 4 per verification.
    assert tokens_per_pass([RequestRecord(17, 1.0, passes=5)]) == 4.0
    assert tokens_per_pass([RequestRecord(6, 1.0, passes=6)]) == 1.0  # plain decoding
