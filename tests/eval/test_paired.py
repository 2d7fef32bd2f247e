"""Paired bootstrap intervals of speedups (eval/paired.py)."""

import pytest

from speclab.eval.paired import (MIN_SHARED, figures_of, keyed, median_and_range, paired_ratio, prompt_key,
                                 speedup_interval, verdict)

PLAIN_SECONDS = [1.0, 3.0, 2.0, 5.0, 1.5, 4.0, 2.5, 0.5]  # prompts of very different lengths


def records(speedups):
    return [{"key": f"p{i}", "new_tokens": 100, "spec_new_tokens": 100, "plain_seconds": s,
             "spec_seconds": s / x} for i, (s, x) in enumerate(zip(PLAIN_SECONDS, speedups))]


def test_the_interval_holds_the_pooled_speedup():
    figures = list(keyed(records([1.5, 2.5, 1.2, 3.0, 1.8, 2.2])).values())
    lo, hi = speedup_interval(figures)
    pooled = sum(f[3] for f in figures) / sum(f[1] for f in figures)  # equal tokens: plain s / spec s
    assert lo < pooled < hi and hi - lo > 0.3  # prompts this different leave a wide interval
    assert speedup_interval([]) is None


def test_pairing_separates_a_consistent_lead_the_marginal_intervals_do_not():
    # Prompt difficulty varies a lot, but b is 5% faster on every prompt.
    base = [1.5, 2.5, 1.2, 3.0, 1.8, 2.2, 1.4, 2.8]
    a, b = keyed(records(base)), keyed(records([x * 1.05 for x in base]))
    ia, ib = speedup_interval(list(a.values())), speedup_interval(list(b.values()))
    assert ia[0] <= ib[1] and ib[0] <= ia[1]  # the marginal intervals overlap
    found = verdict(b, ib, a, ia)
    assert found["by"] == "paired" and not found["tied"]
    assert found["ratio"] == pytest.approx(1.05) and found["ci"][0] > 1


def test_runs_that_trade_prompts_are_tied():
    a = keyed(records([1.5, 2.5, 1.2, 3.0, 1.8, 2.2]))
    b = keyed(records([1.6, 2.4, 1.3, 2.9, 1.7, 2.3]))
    found = verdict(b, None, a, None)
    assert found["tied"] and found["ci"][0] < 1 < found["ci"][1]
    assert verdict(a, None, a, None)["tied"]


def test_only_shared_prompts_are_paired():
    a = keyed(records([1.5, 2.5, 1.2, 3.0]))
    b = {f"x{i}": f for i, f in enumerate(keyed(records([1.5, 2.5])).values())}  # other prompts
    assert paired_ratio(a, b) is None and MIN_SHARED == 2
    # no shared prompts: the intervals decide; neither: nothing is known
    assert verdict(a, [1.4, 2.0], b, [1.9, 2.5]) == {"tied": True, "by": "intervals"}
    assert verdict(a, [1.4, 1.8], b, [1.9, 2.5]) == {"tied": False, "by": "intervals"}
    assert verdict(a, None, b, [1.9, 2.5]) is None


def test_older_records_give_their_seconds_through_their_rates():
    old = {"new_tokens": 64, "baseline_tok_s": 32.0, "spec_tok_s": 64.0}  # before seconds were recorded
    assert figures_of(old) == (64.0, 1.0, 64.0, 2.0)
    assert figures_of({"new_tokens": 64}) is None and figures_of({**old, "spec_tok_s": 0}) is None
    assert list(keyed([old, old])) == ["#0", "#1"]  # no keys: paired by position


def test_prompt_key_names_the_ids():
    assert prompt_key([1, 2, 3]) == prompt_key([1, 2, 3]) != prompt_key([1, 2, 4])
    assert len(prompt_key([1])) == 16


def test_median_and_range_of_repeated_scorings():
    assert median_and_range([1.83, 2.12, 1.9]) == {"values": [1.83, 2.12, 1.9], "median": 1.9,
                                                    "interval": [1.83, 2.12]}
