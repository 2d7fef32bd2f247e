"""Timing probes for the choices made by measuring this machine (the bf16 GEMM path, the wide
passes' engine, the training precision): each candidate run in turn, round after round, so
that a burst of load on this noisy machine hits every candidate, and judged by its median."""

from __future__ import annotations

import statistics
import time
from typing import Callable


def alternated_ms(runs: dict[str, Callable[[], object]], rounds: int, calls: int = 1,
                  warm: bool = True) -> dict[str, float]:
    """Median ms per call of each run, the runs alternated within every round. `warm` calls
    each once first (oneDNN builds its kernel on a shape's first call)."""
    if warm:
        for run in runs.values():
            run()
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            start = time.perf_counter()
            for _ in range(calls):
                run()
            samples[name].append((time.perf_counter() - start) * 1e3 / calls)
    return {name: round(statistics.median(v), 4) for name, v in samples.items()}
