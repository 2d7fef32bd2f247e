"""Which bf16 GEMM path this machine runs faster: measured once per machine, remembered.

On AVX512-BF16 CPUs native.c can multiply bf16 weights as bf16 pairs (vdpbf16ps, its input
rows rounded to bf16) or widen them to fp32 and use fp32 FMAs. A flag cannot say which is
faster: that is the two instructions' issue rates. An AVX512-BF16 Xeon (lscpu model 207)
issues vdpbf16ps at 0.5 per cycle and fp32 FMAs at 2, so widening does twice the products
per cycle, and it won at every pass width there (docs/results.md); a CPU whose pair rate is
closer to its FMA rate would pick the pairs.

The two paths give slightly different numbers (bf16-rounded or full fp32 inputs). Each is
batch-invariant, so decoding is lossless either way, but the choice is remembered per
machine and kernel build (machine_records.py) so that every process on a machine computes
the same bits. SPECLAB_BF16_PAIRS=1 or 0 overrides it.
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from functools import lru_cache

import torch

from .. import machine_records

log = logging.getLogger(__name__)
RECORDS = "bf16-gemm-path"  # the speclab cache folder of the remembered choices
# A 9-token verification and a 1-token step through SmolLM2's MLP up-projection: weights
# (3.5 MB in bf16) beyond L2, so the probe pays for memory as a real pass does.
PROBE_ROWS, PROBE_OUT, PROBE_IN = (1, 9), 3072, 576
RECORD_KEY = [PROBE_ROWS, PROBE_OUT, PROBE_IN]  # the record's key beside the machine's own (machine_records)
ROUNDS, CALLS = 7, 4


@lru_cache(maxsize=None)
def pairs_pay(lib) -> bool:
    """True where this machine should multiply bf16 weights as bf16 pairs."""
    if not lib.lean_bf16_dot():
        return False
    forced = os.environ.get("SPECLAB_BF16_PAIRS")
    if forced is not None:
        if forced not in ("0", "1"):
            raise ValueError(f"SPECLAB_BF16_PAIRS must be 0 or 1, got {forced!r}")
        return forced == "1"
    record = machine_records.read(RECORDS, RECORD_KEY)
    if record is not None and isinstance(record.get("pairs"), bool):
        return record["pairs"]
    ms = time_paths(lib)
    pairs = ms["pairs"] < ms["widened"]
    try:
        machine_records.write(RECORDS, RECORD_KEY, {"pairs": pairs, "probe_ms": ms, "machine": machine_records.machine_name()})
    except OSError as exc:  # a read-only cache costs a probe per process, not the run
        log.warning("could not remember the bf16 GEMM path (%s): it is measured again next time", exc)
    log.info("bf16 GEMMs: %s (probe ms %s)", "bf16 pairs" if pairs else "widened to fp32", ms)
    return pairs


def time_paths(lib) -> dict[str, float]:
    """Median ms of the probe (a 1-row and a 9-row GEMM) on each path, the paths alternated
    so that a burst of load hits both."""
    from .ops import NativeOps

    g = torch.Generator().manual_seed(0)
    w = (torch.randn(PROBE_OUT, PROBE_IN, generator=g) * 0.02).to(torch.bfloat16)
    xs = [torch.randn(rows, PROBE_IN, generator=g) for rows in PROBE_ROWS]
    paths = {name: NativeOps(lib, bf16_pairs=pairs) for name, pairs in (("pairs", True), ("widened", False))}
    packed = {name: ops.pack(w) for name, ops in paths.items()}
    samples: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(ROUNDS):
        for name, ops in paths.items():
            start = time.perf_counter()
            for _ in range(CALLS):
                for x in xs:
                    ops.linear(x, packed[name])
            samples[name].append((time.perf_counter() - start) * 1e3 / CALLS)
    return {name: round(statistics.median(v), 4) for name, v in samples.items()}
