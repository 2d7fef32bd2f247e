"""Which of two scorings is faster, and whether the prompts say so: paired bootstrap intervals.

A speedup measured on a handful of prompts moves by tenths from one scoring to the next, so
a leaderboard names a winner only where the prompts separate it. Each scoring records, per
prompt, the speculative and the plain decoding's new tokens and seconds (result.json's
`eval.per_prompt`, benchmark.PromptResult.to_dict). From those:

    speedup(S)      = (sum_S spec tokens / sum_S spec seconds) / (sum_S plain tokens / sum_S plain seconds)
    speedup interval: percentile bootstrap of speedup(S) over prompt resamples S
    paired ratio    = speedup_a(S) / speedup_b(S) over the prompts both scored, the SAME
                      resample S for both, so what makes a prompt easy for every drafter
                      (a long copy, a short answer) cancels instead of widening the interval

The rule (docs/design.md, "Winners only where the intervals say so"): where the two runs
share at least `MIN_SHARED` prompts, they are tied when the paired ratio's interval contains
1; otherwise they are tied when their speedup intervals overlap. With neither, nothing is
known (None), and callers fall back to the point estimates, saying so.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

RESAMPLES = 1000
LEVEL = 0.95
MIN_SHARED = 2  # one shared prompt gives a zero-width interval: it would separate anything

# (spec new tokens, spec seconds, plain new tokens, plain seconds) of one prompt
Figures = tuple[float, float, float, float]


def prompt_key(ids: Sequence[int]) -> str:
    """A short digest of a prompt's token ids: the same prompt in two runs' records."""
    return hashlib.sha256(np.asarray(ids, dtype=np.int64).tobytes()).hexdigest()[:16]


def figures_of(record: dict) -> Figures | None:
    """One per-prompt record's figures: its seconds where recorded, else derived from its
    tokens/s (records written before the seconds were); None when it holds neither."""
    try:
        plain_tokens = float(record["new_tokens"])
        spec_tokens = float(record.get("spec_new_tokens", plain_tokens))
        plain_s = float(record["plain_seconds"]) if "plain_seconds" in record else plain_tokens / record["baseline_tok_s"]
        spec_s = float(record["spec_seconds"]) if "spec_seconds" in record else spec_tokens / record["spec_tok_s"]
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        return None
    if not all(np.isfinite([spec_tokens, spec_s, plain_tokens, plain_s])) or min(spec_s, plain_s) <= 0:
        return None
    return spec_tokens, spec_s, plain_tokens, plain_s


def keyed(per_prompt: Sequence[dict] | None) -> dict[str, Figures]:
    """Prompt key -> figures, keyed by `key` where every record has one, else by position."""
    records = [r for r in per_prompt or [] if isinstance(r, dict)]
    by_key = all("key" in r for r in records)
    out = {}
    for i, record in enumerate(records):
        figures = figures_of(record)
        if figures is not None:
            out[str(record["key"]) if by_key else f"#{record.get('index', i)}"] = figures
    return out


def speedup(figures: np.ndarray) -> np.ndarray:
    """figures [..., n, 4] -> the pooled speedup over the n prompts [...]."""
    spec = figures[..., 0].sum(-1) / figures[..., 1].sum(-1)
    plain = figures[..., 2].sum(-1) / figures[..., 3].sum(-1)
    return spec / plain


def speedup_interval(figures: Sequence[Figures], resamples: int = RESAMPLES, level: float = LEVEL,
                     seed: int = 0) -> list[float] | None:
    """[lo, hi] of the pooled speedup, prompts resampled with replacement (None: no prompts)."""
    if not figures:
        return None
    data = np.asarray(figures, dtype=np.float64)  # [n, 4]
    draws = _draws(len(data), resamples, seed)  # [R, n]
    return _percentiles(speedup(data[draws]), level)


def paired_ratio(a: dict[str, Figures], b: dict[str, Figures], resamples: int = RESAMPLES, level: float = LEVEL,
                 seed: int = 0) -> dict | None:
    """{"prompts", "ratio", "ci"}: speedup of a over speedup of b on the prompts both scored,
    each resample drawn once for both (None: fewer than MIN_SHARED shared prompts)."""
    shared = [key for key in a if key in b]
    if len(shared) < MIN_SHARED:
        return None
    fa = np.asarray([a[k] for k in shared], dtype=np.float64)  # [n, 4]
    fb = np.asarray([b[k] for k in shared], dtype=np.float64)
    draws = _draws(len(shared), resamples, seed)  # [R, n]
    ratios = speedup(fa[draws]) / speedup(fb[draws])  # [R]
    return {"prompts": len(shared), "ratio": float(speedup(fa) / speedup(fb)), "ci": _percentiles(ratios, level)}


def verdict(a_figures: dict[str, Figures], a_interval: Sequence[float] | None,
            b_figures: dict[str, Figures], b_interval: Sequence[float] | None) -> dict | None:
    """Whether a and b are tied, by the rule of the module docstring: {"tied", "by", ...}
    ("by": "paired" with the ratio and its interval, or "intervals"); None when neither
    the shared prompts nor both intervals are there to judge by."""
    paired = paired_ratio(a_figures, b_figures)
    if paired is not None:
        lo, hi = paired["ci"]
        return {"tied": lo <= 1.0 <= hi, "by": "paired", **paired}
    if _interval(a_interval) and _interval(b_interval):
        return {"tied": overlaps(a_interval, b_interval), "by": "intervals"}
    return None


def overlaps(a: Sequence[float], b: Sequence[float]) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


def median_and_range(values: Sequence[float]) -> dict:
    """Repeated scorings of one thing: {"values", "median", "interval": [min, max]}. With
    three to five scorings a percentile interval is their range."""
    values = [float(v) for v in values]
    return {"values": values, "median": float(np.median(values)), "interval": [min(values), max(values)]}


def _interval(value) -> bool:
    return isinstance(value, (list, tuple)) and len(value) == 2 and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) for v in value)


def _draws(n: int, resamples: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, n, size=(resamples, n))


def _percentiles(values: np.ndarray, level: float) -> list[float]:
    tail = (1 - level) / 2
    return [float(np.quantile(values, tail)), float(np.quantile(values, 1 - tail))]
