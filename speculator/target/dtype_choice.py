"""`dtype: auto`: the dtype this machine decodes fastest in, measured, not guessed from a flag.

A CPU flag says what the hardware could do, not what the software stack makes of it: on
one AVX-512-BF16 machine transformers' bf16 decode step was slower than its fp32 one. So
`auto` times the decode step itself (a short prefill, then single-token steps, each dtype
alternately) through the runtime the target will use and keeps the faster. The timing is
the machine profile's measuring step (speclab.speculator.target.measure), done once per
machine, kernel build and target and recorded in the profile; a target builder reads the
answer (profile.auto_dtype) and never times. CUDA takes bf16 without measuring.
"""

from __future__ import annotations

import copy
import statistics
import time

import torch

from .frozen import FrozenTarget
from .profile import DTYPES, MachineProfile

PREFILL, STEPS, ROUNDS = 64, 6, 3


def _step_ms(target) -> float:
    """Median ms of one single-token decode step after a prefill of PREFILL tokens."""
    ids = torch.randint(0, target.vocab_size, (1, PREFILL + STEPS), generator=torch.Generator().manual_seed(0))
    ids = ids.to(target.device)
    cache = target.new_cache(max_len=PREFILL + STEPS)
    target(ids[:, :PREFILL], cache, logits_for="last")
    times = []
    for i in range(PREFILL, PREFILL + STEPS):
        start = time.perf_counter()
        target(ids[:, i : i + 1], cache, logits_for="last")
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def time_dtypes(model, name: str, runtime: str, lean_backend: str, profile: MachineProfile) -> dict[str, float]:
    """Best ms of a decode step of `model` (any dtype) in each of DTYPES, the dtypes
    alternated so that a burst of load hits both; the decoders built with `profile`'s
    kernel choices."""
    targets = {key: FrozenTarget(copy.deepcopy(model).to(dtype=dt), None, name, runtime=runtime,
                                 lean_backend=lean_backend, profile=profile)
               for key, dt in DTYPES.items()}
    samples: dict[str, list[float]] = {key: [] for key in targets}
    for _ in range(ROUNDS):
        for key, target in targets.items():
            samples[key].append(_step_ms(target))
    return {key: round(min(v), 3) for key, v in samples.items()}
