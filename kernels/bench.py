"""Fused against unfused, time and peak memory: `python -m speclab.kernels.bench`.

distill: forward + backward of the distillation loss (forward KL) from hidden states and
    heads. Fused: the Triton kernel on a GPU, the chunked torch reference on CPU. Unfused: the
    naive loss that builds the [N, V] logits (`distill_loss_naive`).
verify: one verification of [B, k+1, V] target logits. Fused: the Triton kernel on a GPU;
    on CPU only the torch reference exists and is timed alone.

Each (op, shape, variant) runs in its own subprocess, one at a time, so that one peak does not
hide another: CPU peak memory is the rise of the process's peak RSS (getrusage) over its RSS
once the inputs exist; GPU peak memory is torch.cuda.max_memory_allocated over the inputs.
A naive config whose logits would not fit in the free RAM is skipped, not run.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

import torch

# The naive loss holds about this many [N, V] fp32 tensors at its peak (logits of both sides,
# log-softmaxes, p, the KL terms and their gradients); used only to skip configs that cannot fit.
NAIVE_NV_COPIES = 8


@dataclass
class Measurement:
    op: str  # "distill" | "verify"
    variant: str  # "fused" | "naive" | "reference"
    shape: str  # "N=8192 D=576 V=49152", ...
    device: str
    time_s: float | None  # one forward + backward (distill) or one call (verify)
    peak_mb: float | None  # memory the op added above its inputs
    note: str = ""


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def _reset_peak_rss() -> None:
    """Restart the kernel's high-water mark (VmHWM) at the current RSS, so a peak read after
    an op is the op's own, also in a process that peaked earlier (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass  # not Linux, or not allowed: the lifetime peak (ru_maxrss) is all there is


def _peak_rss_mb() -> float:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # KiB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _available_mb() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    return float("inf")


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _distill_call(variant: str, N: int, D: int, V: int, device: str):
    from speclab.kernels.distill_loss import distill_loss, distill_loss_naive

    g = torch.Generator(device=device).manual_seed(0)
    hd = torch.randn(N, D, device=device, generator=g, requires_grad=True)
    wd = (torch.randn(V, D, device=device, generator=g) / D**0.5).requires_grad_()
    ht = torch.randn(N, D, device=device, generator=g)
    wt = torch.randn(V, D, device=device, generator=g) / D**0.5

    def call():
        if variant == "naive":
            loss = distill_loss_naive(hd, wd, ht, wt, "kl")[0]
        else:
            loss = distill_loss(hd, wd, ht, wt, "kl").loss
        loss.sum().backward()
        hd.grad = wd.grad = None

    return call


def _verify_call(variant: str, B: int, k: int, V: int, device: str):
    from speclab.kernels.verify import verify_sample

    g = torch.Generator(device=device).manual_seed(0)
    logits = torch.randn(B, k + 1, V, device=device, generator=g)
    q = torch.softmax(torch.randn(B, k, V, device=device, generator=g), -1)
    drafts = torch.randint(V, (B, k), device=device, generator=g)
    u = torch.rand(B, k + 1, device=device, generator=g)
    if variant == "fused":
        from speclab.kernels.verify.triton import verify_triton

        return lambda: verify_triton(drafts, q, logits, "sample", u)
    return lambda: verify_sample(drafts, q, logits, u)


def measure_child(op: str, variant: str, sizes: list[int], device: str) -> Measurement:
    """Runs in the child process: build inputs, warm up on a small copy, time one call."""
    build = _distill_call if op == "distill" else _verify_call
    build(variant, *[min(s, 64) for s in sizes], device)()  # warm-up: kernels compiled, allocator primed
    call = build(variant, *sizes, device)
    _sync(device)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        _reset_peak_rss()
        base = _rss_mb()
    start = time.perf_counter()
    call()
    _sync(device)
    elapsed = time.perf_counter() - start
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20 if device == "cuda" else _peak_rss_mb() - base
    return Measurement(op, variant, _shape_name(op, sizes), device, elapsed, peak)


def _shape_name(op: str, sizes: list[int]) -> str:
    names = ("N", "D", "V") if op == "distill" else ("B", "k", "V")
    return " ".join(f"{n}={s}" for n, s in zip(names, sizes))


def run_isolated(op: str, variant: str, sizes: list[int], device: str) -> Measurement:
    if op == "distill" and variant == "naive" and device == "cpu":
        need = NAIVE_NV_COPIES * sizes[0] * sizes[2] * 4 / 2**20
        if need > 0.8 * _available_mb():
            return Measurement(op, variant, _shape_name(op, sizes), device, None, None,
                               f"skipped: needs ~{need / 1024:.0f} GiB, {_available_mb() / 1024:.0f} GiB free")
    cmd = [sys.executable, "-m", "speclab.kernels.bench", "--child", op, variant, device, *map(str, sizes)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return Measurement(op, variant, _shape_name(op, sizes), device, None, None, f"failed: {tail[:120]}")
    return Measurement(**json.loads(proc.stdout.strip().splitlines()[-1]))


def sweep(ops: list[str], distill_shapes: list[list[int]], verify_shapes: list[list[int]], device: str):
    fused = "fused" if device == "cuda" else "reference"
    plan = []
    if "distill" in ops:
        plan += [("distill", v, s) for s in distill_shapes for v in ("reference" if device == "cpu" else "fused", "naive")]
    if "verify" in ops:
        plan += [("verify", v, s) for s in verify_shapes for v in ([fused, "reference"] if device == "cuda" else [fused])]
    for op, variant, sizes in plan:
        yield run_isolated(op, variant, sizes, device)


def print_table(rows: list[Measurement]) -> None:
    print(f"{'op':8} {'variant':10} {'shape':24} {'device':6} {'time s':>9} {'peak MB':>9}  note")
    for r in rows:
        t = f"{r.time_s:9.3f}" if r.time_s is not None else f"{'-':>9}"
        m = f"{r.peak_mb:9.0f}" if r.peak_mb is not None else f"{'-':>9}"
        print(f"{r.op:8} {r.variant:10} {r.shape:24} {r.device:6} {t} {m}  {r.note}")
    by_key = {(r.op, r.shape, r.variant): r for r in rows}
    for r in rows:
        naive = by_key.get((r.op, r.shape, "naive"))
        if r.variant != "naive" and naive and r.time_s and naive.time_s:
            # A tiny op can add no measurable RSS (peak 0 MB): no ratio then.
            memory = f"{r.peak_mb / naive.peak_mb:.3f}" if naive.peak_mb else "n/a"
            print(f"{r.op} {r.shape}: {r.variant} / naive = {memory} peak memory, "
                  f"{r.time_s / naive.time_s:.2f}x time")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--op", choices=["distill", "verify", "all"], default="all")
    parser.add_argument("--n", type=int, nargs="+", default=[2048], help="distill: positions N")
    parser.add_argument("--d", type=int, default=576, help="distill: hidden size D (SmolLM2's 576)")
    parser.add_argument("--v", type=int, nargs="+", default=[8192, 49152], help="vocabulary sizes")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8], help="verify: batch sizes B")
    parser.add_argument("--k", type=int, default=4, help="verify: draft length k")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON ('-' for stdout only)")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        op, variant, device, *sizes = args.child
        print(json.dumps(asdict(measure_child(op, variant, [int(s) for s in sizes], device))))
        return
    ops = ["distill", "verify"] if args.op == "all" else [args.op]
    distill_shapes = [[n, args.d, v] for n in args.n for v in args.v]
    verify_shapes = [[b, args.k, v] for b in args.batch for v in args.v]
    rows = []
    for row in sweep(ops, distill_shapes, verify_shapes, args.device):
        rows.append(row)
        if args.json != "-":
            print(f"  {row.op} {row.variant} {row.shape}: {row.time_s} s, {row.peak_mb} MB {row.note}", file=sys.stderr)
    if args.json == "-":
        print(json.dumps([asdict(r) for r in rows], indent=2))
        return
    print_table(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(r) for r in rows], f, indent=2)


if __name__ == "__main__":
    main()
