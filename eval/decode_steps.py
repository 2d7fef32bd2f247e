"""Where a batched decoding step of the lean runtime goes: the whole step against its GEMMs.

    python -m speclab.eval.decode_steps [--rows 1 8 16 32 48] [--context 250] [--dtype auto] [--threads 2]

Batched self-distillation is steps of B rows, one new token each, over B cached contexts.
For each B: the median ms of such a step (LM head included, as generation runs it), the
same GEMMs timed alone at the same shapes (every layer's qkv, o, gate_up and down, and the
LM head), and what is left (attention over the cache, norms, the call's overhead); the
GEMMs' multiply-adds per second say how near the cores' peak they run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from speclab.speculator.target.runtime.model import LeanDecoder


def _median_ms(fn, repeats: int) -> float:
    fn()  # warm: first-touch pages, thread pool
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def _gemm_ms(decoder: LeanDecoder, rows: int, repeats: int) -> tuple[float, float, int]:
    """(every layer's GEMMs, the LM head, multiply-adds of both) for `rows` rows. The layers
    share shapes, so the first is timed and counted once per layer."""
    ops, layer = decoder.ops, decoder.layers[0]
    weights = (layer.qkv, layer.o, layer.gate_up, layer.down)
    inputs = [torch.randn(rows, w.in_features) for w in weights]
    per_layer = sum(_median_ms(lambda w=w, x=x: ops.linear(x, w), repeats) for w, x in zip(weights, inputs))
    head_x = torch.randn(rows, decoder.head.in_features)
    head = _median_ms(lambda: ops.linear(head_x, decoder.head), repeats)
    macs = rows * (len(decoder.layers) * sum(w.in_features * w.out_features for w in weights)
                   + decoder.head.in_features * decoder.head.out_features)
    return per_layer * len(decoder.layers), head, macs


def step_breakdown(decoder: LeanDecoder, rows: int, context: int, repeats: int = 8, seed: int = 0) -> dict:
    """One decoding step of `rows` rows at `context` cached tokens each, and its GEMMs alone."""
    g = torch.Generator().manual_seed(seed)
    vocab = decoder.head.out_features
    cache = decoder.new_cache(rows=rows, max_len=context + 1)
    for r in range(rows):
        decoder.forward(torch.randint(0, vocab, (1, context), generator=g), cache, rows=[r], logits_for="none")
    ids = torch.randint(0, vocab, (rows, 1), generator=g)
    every = list(range(rows))

    def step():
        decoder.forward(ids, cache, rows=every, logits_for="last")
        for r in every:  # back to the same context: every repetition times the same step
            cache.rollback(1, r)

    step_ms = _median_ms(step, repeats)
    layers_ms, head_ms, macs = _gemm_ms(decoder, rows, repeats)
    return {"rows": rows, "step_ms": step_ms, "tok_s": rows / step_ms * 1e3, "layer_gemms_ms": layers_ms,
            "head_ms": head_ms, "rest_ms": step_ms - layers_ms - head_ms,
            "gemm_gmac_s": macs / (layers_ms + head_ms) / 1e6}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="+", type=int, default=[1, 8, 16, 32, 48])
    parser.add_argument("--context", type=int, default=250, help="cached tokens per row")
    parser.add_argument("--dtype", default="auto", choices=["auto", "fp32", "bf16"])
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from speclab.speculator.target.builders import smollm2_from_gguf
    from speclab.speculator.target.measure import prepare_for

    prepare_for(smollm2_from_gguf, {"dtype": args.dtype})  # the machine profile this build reads
    target = smollm2_from_gguf(dtype=args.dtype)
    print(f"load {os.getloadavg()[0]:.2f}, {torch.get_num_threads()} threads, dtype {target.dtype}, "
          f"context {args.context}")
    print(f"{'rows':>5} {'step ms':>8} {'tok/s':>7} {'layer GEMMs ms':>15} {'LM head ms':>11} {'rest ms':>8} "
          f"{'GEMM GMAC/s':>12}")
    for rows in args.rows:
        r = step_breakdown(target.lean, rows, args.context)
        print(f"{rows:>5} {r['step_ms']:8.1f} {r['tok_s']:7.1f} {r['layer_gemms_ms']:15.1f} {r['head_ms']:11.1f} "
              f"{r['rest_ms']:8.1f} {r['gemm_gmac_s']:12.1f}", flush=True)


if __name__ == "__main__":
    main()
