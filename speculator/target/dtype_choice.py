"""`dtype: auto`: the dtype this machine decodes fastest in, measured, not guessed from a flag.

A CPU flag says what the hardware could do, not what the software stack makes of it: on
one AVX-512-BF16 machine transformers' bf16 decode step was slower than its fp32 one. So
`auto` times the decode step itself (a short prefill, then single-token steps, each dtype
alternately) through the runtime the target will use, keeps the faster, and remembers the
answer per machine, model and software versions under the speclab cache, so later loads
cost nothing. CUDA takes bf16 without measuring.
"""

from __future__ import annotations

import copy
import logging
import statistics
import time

import torch

from speclab.speculator import machine_records

log = logging.getLogger(__name__)
CANDIDATES = {"fp32": torch.float32, "bf16": torch.bfloat16}
RECORDS = "dtype-choice"  # the speclab cache folder of the remembered choices (speculator/machine_records.py)
PREFILL, STEPS, ROUNDS = 64, 6, 3


def _key(model, name: str, runtime: str) -> list:
    return [name, model.config.to_json_string(), runtime, 1]


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


def measured_dtype(model, name: str, runtime: str, device: str, lean_backend: str = "auto") -> tuple[torch.dtype, dict]:
    """(fastest dtype, a record of how it was chosen) for `model` (any dtype) on this machine."""
    if device.startswith("cuda"):
        return torch.bfloat16, {"requested": "auto", "source": "cuda default"}
    key = _key(model, name, f"{runtime}/{lean_backend}")
    record = machine_records.read(RECORDS, key)
    if record is not None and record.get("fastest") in CANDIDATES:
        return CANDIDATES[record["fastest"]], {**record, "source": "measured earlier on this machine"}
    from .frozen import FrozenTarget

    targets = {key: FrozenTarget(copy.deepcopy(model).to(dtype=dt), None, name, runtime=runtime, lean_backend=lean_backend)
               for key, dt in CANDIDATES.items()}
    samples: dict[str, list[float]] = {key: [] for key in targets}
    for _ in range(ROUNDS):  # alternated, so a burst of load hits both
        for key, target in targets.items():
            samples[key].append(_step_ms(target))
    ms = {key: round(min(v), 3) for key, v in samples.items()}
    fastest = min(ms, key=ms.get)
    record = {"requested": "auto", "fastest": fastest, "decode_step_ms": ms, "machine": machine_records.machine_name()}
    machine_records.write(RECORDS, key, record)
    log.info("dtype auto: %s (decode step ms %s)", fastest, ms)
    return CANDIDATES[fastest], {**record, "source": "measured"}
