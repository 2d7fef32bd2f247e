"""`training.precision`: the arithmetic a speculator trains in, fp32 or bf16 autocast.

bf16 autocast keeps fp32 master weights, optimizer state and checkpoints, and multiplies in
bf16: on a CPU with AMX tiles or AVX512-BF16 that is oneDNN's bf16 kernels, and one training
step of SmolLM2's speculators ran 1.4x (mlp) to 1.8x (eagle3) faster than in fp32 on an AMX
Xeon. On a CPU without bf16 instructions torch emulates bf16 matmuls, about 10x slower than
fp32 (module.py's `target_logits`). So `auto` times a draft head's forward and backward in
both, alternated, takes bf16 only where it clearly wins, and remembers the answer per machine
(machine_records.py). CUDA keeps fp32 under `auto` (not yet measured on a GPU here; `bf16`
asks for it). The target's logits, the teacher, are always computed in fp32 (module.py).
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from speclab.kernels.util import machine_records
from speclab.kernels.util.timing import alternated_ms

log = logging.getLogger(__name__)
PRECISIONS = ("auto", "fp32", "bf16")
RECORDS = "train-precision"  # the speclab cache folder of the remembered choices
# A draft head over SmolLM2's draft vocabulary: rows x hidden -> vocab, forward and backward.
PROBE_ROWS, PROBE_IN, PROBE_OUT = 512, 576, 8192
RECORD_KEY = [PROBE_ROWS, PROBE_IN, PROBE_OUT]
ROUNDS = 5
MIN_GAIN = 1.2  # bf16 rounds every product's inputs: take it only for a clear speed-up


def choose_precision(requested: str, device: torch.device) -> tuple[str, dict]:
    """(fp32 | bf16, how it was chosen) for `training.precision` = requested."""
    if requested not in PRECISIONS:
        raise ValueError(f"unknown training.precision {requested!r}; valid: {list(PRECISIONS)}")
    if requested != "auto":
        return requested, {"requested": requested, "source": "config"}
    if device.type != "cpu":
        return "fp32", {"requested": "auto", "source": f"{device.type} default"}
    record = machine_records.read(RECORDS, RECORD_KEY)
    if record is not None and record.get("precision") in ("fp32", "bf16"):
        return record["precision"], {**record, "source": "measured earlier on this machine"}
    ms = probe_ms()
    precision = "bf16" if ms["fp32"] >= MIN_GAIN * ms["bf16"] else "fp32"
    record = {"requested": "auto", "precision": precision, "probe_ms": ms, "machine": machine_records.machine_name()}
    machine_records.remember(RECORDS, RECORD_KEY, record, "the training precision")
    log.info("training precision auto: %s (probe ms %s)", precision, ms)
    return precision, {**record, "source": "measured"}


def probe_ms() -> dict[str, float]:
    """Median ms of a draft head's forward and backward in fp32 and under bf16 autocast."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(PROBE_ROWS, PROBE_IN, generator=g).requires_grad_()
    w = (torch.randn(PROBE_OUT, PROBE_IN, generator=g) * 0.02).requires_grad_()

    def step(bf16: bool):
        def run():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                out = F.linear(x, w)
            out.float().square().mean().backward()
            x.grad = w.grad = None
        return run

    return alternated_ms({"fp32": step(False), "bf16": step(True)}, ROUNDS)
