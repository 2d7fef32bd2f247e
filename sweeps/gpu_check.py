"""Does speclab run on this GPU? One command, one table, a few minutes on one card.

    python -m speclab.sweeps.gpu_check [--device cuda] [--json OUT] [--skip-smollm2]

Rows, each with its figure and what it is measured against:
- the Triton kernels (`verify` greedy and sampled, the fused distillation loss forward and
  backward) compiled for the device against their pure-torch references on the same inputs:
  mismatched tokens or the largest error, and ms against the reference's ms;
- plain greedy decoding of SmolLM2 on the device, eager and through `torch.compile`
  (the target's `compile` option, CUDA graphs where the compiler takes them): ms a token
  against the bound the device's copy bandwidth puts on reading the weights once a token;
- a tiny sweep end to end (`speclab train target=tiny ...` on the device): trains, scores,
  checks lossless; and the same under `training.strategy=fsdp` (torch's FSDP runs on
  accelerators only, so this row is where the sharded strategy is exercised);
- SmolLM2 speculative decoding on the device: `suffix` (no training) and `eagle3` trained
  on the smoke budget, each against plain decoding in its run (acceptance length, speedup,
  lossless).

`--device cpu` runs the same rows on the tiny target with the Triton kernels in Triton's
interpreter: how the tests check the plumbing on machines without a GPU. Nothing here
changes the installation; every run writes under a temporary directory.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HEADER = ("check", "result", "against", "note")
DECODE_TOKENS = 64


def _ms(fn, device: torch.device, repeats: int = 5) -> float:
    """Median wall ms of fn() over `repeats` calls after one warm-up (which compiles)."""
    fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append((time.perf_counter() - start) * 1e3)
    return sorted(times)[len(times) // 2]


def verify_rows(device: torch.device, vocab: int) -> list[dict]:
    """verify_triton against the torch reference: the same accepted counts and next tokens."""
    from speclab.kernels.verify.reference import verify_greedy, verify_sample
    from speclab.kernels.verify.triton import verify_triton

    g = torch.Generator().manual_seed(0)
    batch, k = 8, 8
    logits = torch.randn(batch, k + 1, vocab, generator=g).to(device)
    drafts = logits[:, :k].argmax(-1)  # mostly accepted: the rows run deep into the block
    drafts[::3, k // 2] = (drafts[::3, k // 2] + 1) % vocab  # some rejected midway
    probs = torch.softmax(torch.randn(batch, k, vocab, generator=g), -1).to(device)
    randoms = torch.rand(batch, k + 1, generator=g).to(device)
    warped = torch.softmax(logits, -1)
    rows = []
    for mode, ref in (("greedy", lambda: verify_greedy(drafts, logits)),
                      ("sample", lambda: verify_sample(drafts, probs, warped, randoms))):
        args = (drafts, None, logits) if mode == "greedy" else (drafts, probs, warped)
        fused = lambda: verify_triton(*args, mode, None if mode == "greedy" else randoms)  # noqa: E731
        (n, nxt), (n_ref, nxt_ref) = fused(), ref()
        wrong = int(((n != n_ref) | (nxt != nxt_ref)).sum())
        rows.append({"check": f"kernel verify {mode} [{batch}, {k + 1}, {vocab}]", "result": f"{wrong}/{batch} rows differ",
                     "against": f"{_ms(fused, device):.3f} ms vs torch {_ms(ref, device):.3f} ms", "ok": wrong == 0,
                     "note": ""})
    return rows


def distill_row(device: torch.device, n: int, d: int, vocab: int) -> dict:
    """The fused loss's value and gradient against the chunked torch reference."""
    from speclab.kernels.distill_loss import distill_loss

    g = torch.Generator().manual_seed(1)
    hd, hw = torch.randn(n, d, generator=g), torch.randn(vocab, d, generator=g) * d ** -0.5
    ht, tw = torch.randn(n, d, generator=g), torch.randn(vocab, d, generator=g) * d ** -0.5

    def run(backend):
        h, w = hd.to(device).requires_grad_(), hw.to(device).requires_grad_()
        loss = distill_loss(h, w, ht.to(device), tw.to(device), "kl", backend=backend).loss
        loss.sum().backward()
        return loss.detach(), h.grad, w.grad

    got, want = run("triton"), run("reference")
    err = max(float((a - b).abs().max() / b.abs().max().clamp_min(1e-12)) for a, b in zip(got, want))
    # fp32 sums over a vocabulary in another order: relative errors near 1e-6 are rounding.
    return {"check": f"kernel distill_loss kl fwd+bwd N={n} D={d} V={vocab}", "result": f"max rel. error {err:.1e}",
            "against": f"{_ms(lambda: run('triton'), device):.1f} ms vs torch {_ms(lambda: run('reference'), device):.1f} ms",
            "ok": err < 1e-4, "note": ""}


def copy_bandwidth_gb_s(device: torch.device, megabytes: int = 512) -> float:
    """Bytes moved (read + written) per second by a device-to-device copy."""
    x = torch.empty(megabytes << 20, dtype=torch.uint8, device=device)
    y = torch.empty_like(x)
    ms = _ms(lambda: y.copy_(x), device)
    return 2 * x.numel() / (ms / 1e3) / 1e9


def decode_rows(target_factory, device: torch.device) -> list[dict]:
    """Plain greedy decoding, eager and compiled, against the weight-read bound."""
    from speclab.eval.engine import generate_plain
    from speclab.eval.runtime_bench import weight_bytes

    bound_ms = None
    rows = []
    for compiled in (False, True):
        target = target_factory(compiled)
        if bound_ms is None:
            bound_ms = weight_bytes(target) / (copy_bandwidth_gb_s(device) / 2 * 1e9) * 1e3  # reads only: half the copy's bytes
        prompt = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8]], device=device)
        start = time.perf_counter()
        generate_plain(target, prompt, 8, eos_ids=[])  # warm-up (the compiler's work)
        warm_s = time.perf_counter() - start
        gen = generate_plain(target, prompt, DECODE_TOKENS, eos_ids=[])
        ms = gen.seconds / gen.new_tokens * 1e3
        rows.append({"check": f"plain decoding {target.name} ({'torch.compile' if compiled else 'eager'}, "
                              f"{str(target.dtype).removeprefix('torch.')})", "ms": ms, "bound_ms": bound_ms,
                     "result": f"{ms:.2f} ms/token", "against": f"{ms / bound_ms:.2f}x the bound {bound_ms:.3f} ms",
                     "ok": True, "note": f"first 8 tokens {warm_s:.1f} s (warm-up{', compilation' if compiled else ''})"})
        del target
    return rows


def train_row(label: str, overrides: list[str], runs: Path) -> dict:
    """One `speclab train` run in a child process; its result.json's figures."""
    runs_dir = runs / re.sub(r"[^A-Za-z0-9]+", "-", label)  # a path Hydra's override grammar takes as is
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "speclab.sweeps.train", *overrides, f"runs_dir={runs_dir}",
                           "wandb.mode=disabled"], capture_output=True, text=True)
    wall = time.perf_counter() - start
    results = sorted(runs_dir.glob("*/result.json"))
    if proc.returncode != 0 or not results:
        lines = [l for l in (proc.stderr + proc.stdout).splitlines() if l.strip() and "HYDRA_FULL_ERROR" not in l]
        return {"check": label, "result": "failed", "against": "", "ok": False, "note": (lines or ["no output"])[-1][:160]}
    r = json.loads(results[-1].read_text())
    acc, thr, ll = r.get("acceptance") or {}, r.get("throughput") or {}, r.get("lossless") or {}
    lossless = ll.get("checked_prompts", 0) - ll.get("mismatches", 0)
    return {"check": label, "result": f"acceptance {acc.get('mean_acceptance_length', 0):.2f}, "
                                      f"{thr.get('speedup', 0):.2f}x",
            "against": f"plain {thr.get('baseline_tok_s', 0):.1f} tok/s in the same run",
            "ok": r.get("status") == "completed" and ll.get("mismatches", 1) == 0,
            "note": f"lossless {lossless}/{ll.get('checked_prompts', 0)}, {wall:.0f} s"}


def smoke_overrides(device: str) -> list[str]:
    return ["training=smoke", "eval=smoke", f"target.device={device}"]


def run(device: torch.device, skip_smollm2: bool) -> list[dict]:
    from speclab.speculator.target.builders import smollm2_from_gguf, tiny_llama

    on_gpu = device.type == "cuda"
    rows = verify_rows(device, 49152 if on_gpu else 600)
    rows.append(distill_row(device, *((8192, 576, 49152) if on_gpu else (64, 32, 300))))
    if on_gpu:
        rows += decode_rows(lambda c: smollm2_from_gguf(dtype="bf16", device=str(device), compile=c), device)
    else:  # the plumbing on the tiny target; compiling it on the CPU only costs time
        rows += decode_rows(lambda c: tiny_llama(device="cpu"), device)[:1]
    with tempfile.TemporaryDirectory(prefix="speclab-gpu-check-") as tmp:
        runs = Path(tmp)
        rows.append(train_row("tiny sweep end to end (mlp)", ["target=tiny", "speculator=mlp", *smoke_overrides(str(device))],
                              runs))
        if on_gpu:  # the sharded strategy's path (full-state checkpoints, sharded gradient norm): CUDA only
            rows.append(train_row("tiny run under FSDP (mlp)", ["target=tiny", "speculator=mlp", "training.strategy=fsdp",
                                                               "training.devices=1", *smoke_overrides(str(device))], runs))
        if not skip_smollm2:
            for family in ("suffix", "eagle3"):
                rows.append(train_row(f"SmolLM2 {family}", [f"speculator={family}", *smoke_overrides(str(device)),
                                                            "target.dtype=bf16"], runs))
    return rows


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({os.cpu_count()} cores)"


def format_rows(rows: list[dict], device: torch.device) -> str:
    from .table import align

    cells = [[r[h] for h in HEADER] + ["yes" if r["ok"] else "NO"] for r in rows]
    table = align([*HEADER, "ok"], cells, [False] * (len(HEADER) + 1))
    return f"speclab GPU check on {device_name(device)} (torch {torch.__version__})\n{table}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N, or cpu (the plumbing, Triton interpreted)")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    parser.add_argument("--skip-smollm2", action="store_true", help="leave out the SmolLM2 speculative runs")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("speclab gpu check: no CUDA device here (torch.cuda.is_available() is False); "
              "--device cpu checks the plumbing", file=sys.stderr)
        return 2
    if device.type == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"  # before the kernels' lazy import of triton
    rows = run(device, args.skip_smollm2)
    print(format_rows(rows, device))
    if args.json:
        args.json.write_text(json.dumps({"device": device_name(device), "torch": torch.__version__, "rows": rows}, indent=1))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
