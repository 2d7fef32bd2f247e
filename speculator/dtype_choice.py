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
import hashlib
import json
import logging
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from .cache_lock import cache_root

log = logging.getLogger(__name__)
CANDIDATES = {"fp32": torch.float32, "bf16": torch.bfloat16}
PREFILL, STEPS, ROUNDS = 64, 6, 3


def _machine() -> str:
    try:
        info = Path("/proc/cpuinfo").read_text()
        model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "")
        flags = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("flags")), "")
    except OSError:
        model, flags = platform.processor(), ""
    return f"{model}|{flags}|threads={torch.get_num_threads()}"


def _record_path(model, name: str, runtime: str) -> Path:
    from transformers import __version__ as hf_version

    key = json.dumps([_machine(), name, model.config.to_json_string(), runtime, torch.__version__, hf_version, 1])
    return cache_root() / "dtype-choice" / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


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
    path = _record_path(model, name, f"{runtime}/{lean_backend}")
    try:
        record = json.loads(path.read_text())
        return CANDIDATES[record["fastest"]], {**record, "source": "measured earlier on this machine"}
    except (OSError, ValueError, KeyError):
        pass
    from .target import FrozenTarget

    targets = {key: FrozenTarget(copy.deepcopy(model).to(dtype=dt), None, name, runtime=runtime, lean_backend=lean_backend)
               for key, dt in CANDIDATES.items()}
    samples: dict[str, list[float]] = {key: [] for key in targets}
    for _ in range(ROUNDS):  # alternated, so a burst of load hits both
        for key, target in targets.items():
            samples[key].append(_step_ms(target))
    ms = {key: round(min(v), 3) for key, v in samples.items()}
    fastest = min(ms, key=ms.get)
    record = {"requested": "auto", "fastest": fastest, "decode_step_ms": ms, "machine": _machine().split("|")[0]}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(record, indent=2))
    os.replace(tmp, path)
    log.info("dtype auto: %s (decode step ms %s)", fastest, ms)
    return CANDIDATES[fastest], {**record, "source": "measured"}
