"""The spike watchdog's rules on synthetic loss series, and its rollback ledger."""

import math

import pytest
import torch

from speclab.training.watchdog import (RollbackBudgetExhausted, SpikeDetector, Trip, Watchdog, WatchdogConfig,
                                       _window)


def trips(series, **kw):
    det = SpikeDetector(WatchdogConfig(**kw))
    return [t for step, loss in enumerate(series, 1) if (t := det.update(step, loss)) is not None]


def clean_series(seed: int, n: int = 2000) -> list[float]:
    """A training-like curve: exponential decay to a floor, with 5% multiplicative noise."""
    g = torch.Generator().manual_seed(seed)
    noise = torch.randn(n, generator=g) * 0.05
    return [(0.8 + 3.0 * math.exp(-i / 300)) * (1 + float(e)) for i, e in enumerate(noise)]


@pytest.mark.parametrize("seed", range(5))
def test_zero_false_trips_on_clean_noise(seed):
    assert trips(clean_series(seed)) == []


def test_non_finite_loss_or_gradient_trips_at_once_even_unarmed():
    det = SpikeDetector(WatchdogConfig())
    assert det.update(1, float("nan")) == Trip(1, 1, "non-finite loss at step 1")
    assert det.update(2, 1.0, grad_norm=float("inf")).onset == 2


def test_a_sustained_spike_trips_after_patience_with_its_onset():
    series = clean_series(0, 200)
    series[120:126] = [x * 3 for x in series[120:126]]  # steps 121..126
    got = trips(series, patience=3)  # without a rollback it goes on tripping: the first one counts
    assert (got[0].step, got[0].onset) == (123, 121)


def test_a_blip_shorter_than_patience_does_not_trip():
    series = clean_series(1, 200)
    series[100:102] = [x * 5 for x in series[100:102]]
    assert trips(series, patience=3) == []


def test_the_ratio_rule_catches_a_doubling_inside_a_noisy_window():
    # std 0.6 around mean 1: mean + 6 std = 4.6, so only the 2x-mean rule sees 2.5
    series = [1.0 + (0.6 if i % 2 else -0.6) for i in range(40)] + [2.5] * 3
    assert [(t.step, t.onset) for t in trips(series)][:1] == [(43, 41)]
    assert trips(series, ratio=3.0) == []


def test_the_sigma_rule_waits_for_min_window_the_ratio_rule_only_for_ratio_after():
    # 1.5x: under the 2x ratio rule, so only the sigma rule (armed at min_window) can see it
    assert trips([1.0, 1.01] * 2 + [1.5] * 5, min_window=10) == []
    assert trips([1.0, 1.01] * 5 + [1.5] * 3, min_window=10)[0].onset == 11
    # 9x from step 5: before, the unarmed rule let it fill the window and it never tripped
    assert trips([1.0] * 4 + [9.0] * 5, min_window=10)[0].onset == 5
    assert trips([1.0] * 4 + [9.0] * 5, min_window=10, ratio_after=10) == []


def test_state_dict_resumes_the_same_judgement():
    series = clean_series(2, 300)
    series[250:255] = [x * 4 for x in series[250:255]]
    a = SpikeDetector(WatchdogConfig())
    for step, loss in enumerate(series[:240], 1):
        a.update(step, loss)
    b = SpikeDetector(WatchdogConfig())
    b.load_state_dict(a.state_dict())
    rest = list(enumerate(series[240:], 241))
    assert [a.update(s, x) for s, x in rest] == [b.update(s, x) for s, x in rest]


def test_rollbacks_are_bounded_and_a_repeat_in_the_same_window_lowers_the_lr(tmp_path):
    wd = Watchdog(WatchdogConfig(max_rollbacks=2, lr_backoff=0.5), tmp_path / "watchdog.json")
    pos = lambda c: {"epoch": 0, "cursor": c}  # noqa: E731
    first = wd.roll_back(Trip(30, 28, "spike"), 20, pos(80), pos(120))
    assert first["skip"] == [(0, 80, 120)] and wd.ledger.lr_scale == 1.0
    wd.roll_back(Trip(29, 25, "spike"), 20, pos(80), pos(116))  # onset inside [20, 30]
    assert wd.ledger.lr_scale == 0.5 and wd.ledger.skips == [(0, 80, 120), (0, 80, 116)]
    with pytest.raises(RollbackBudgetExhausted, match="budget exhausted"):
        wd.roll_back(Trip(60, 58, "spike"), 50, pos(200), pos(240))
    assert len(Watchdog(WatchdogConfig(), tmp_path / "watchdog.json").ledger.rollbacks) == 2  # persisted


def test_skip_window_across_an_epoch_boundary():
    assert _window({"epoch": 1, "cursor": 90}, {"epoch": 2, "cursor": 10}) == [(1, 90, 1 << 62), (2, 0, 10)]
    assert _window({"epoch": 1, "cursor": 90}, {"epoch": 1, "cursor": 90}) == []
