"""Goodness-of-fit helper for the sampling tests (no scipy: torch's incomplete gamma suffices)."""

import torch


def chi2_pvalue(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's chi-squared p-value of `tokens` against `probs` [V]; 0 if a zero-probability token occurs."""
    counts = torch.bincount(tokens, minlength=probs.numel()).double()
    support = probs > 0
    if counts[~support].sum() > 0:
        return 0.0
    expected = probs[support].double() / probs[support].double().sum() * counts.sum()
    statistic = ((counts[support] - expected) ** 2 / expected).sum()
    # The chi-squared survival function with df = support - 1 is the regularised upper gamma.
    df = torch.tensor(support.sum().item() - 1.0, dtype=torch.float64)
    return float(torch.special.gammaincc(df / 2, statistic / 2))
