"""One training step per family at SmolLM2's shapes, its arithmetic variants alternated in one
process: `python -m speclab.training.step_bench [--families mlp hydra eagle3] [--length 192]`.

A step is the speculator's loss, its backward and a fused AdamW step on a batch of 4
sequences of `--length` tokens (the last two thirds trained), over a stand-in target with
SmolLM2-135M's sizes (random weights: the arithmetic is what is timed). Variants:
fp32 / bf16 autocast (`training.precision`) x the forward KL in torch's passes / fused
(`kernels/forward_kl.py`). Rounds alternate the variants so that load hits all; medians.
"""

from __future__ import annotations

import argparse
import statistics
import time
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from speclab.kernels import forward_kl
from speclab.speculator import families  # noqa: F401  (registers the families)
from speclab.speculator.base import Features, TargetInfo
from speclab.speculator.families import build_speculator
from speclab.training.losses import objective

VOCAB, HIDDEN, LAYERS, DRAFT_VOCAB, BATCH = 49152, 576, 30, 8192, 4


@contextmanager
def kl_path(kl: str):
    """The forward KL fused (the kernel) or in torch's passes (the path before it)."""
    saved, forward_kl.NATIVE = forward_kl.NATIVE, kl == "fused"
    try:
        yield
    finally:
        forward_kl.NATIVE = saved


def family_step(family: str, length: int, seed: int = 0):
    """A closure running one step of `family` in (precision, kl) and returning its seconds."""
    g = torch.Generator().manual_seed(seed)
    info = TargetInfo(VOCAB, HIDDEN, LAYERS, "stand-in", embed_weight=torch.randn(VOCAB, HIDDEN, generator=g) * 0.02,
                      lm_head_weight=torch.randn(VOCAB, HIDDEN, generator=g) * 0.02,
                      token_counts=torch.randint(0, 50, (VOCAB,), generator=g))
    torch.manual_seed(seed)
    spec = build_speculator(family, {"draft_vocab_size": DRAFT_VOCAB}, info)
    ids = spec.vocab.ids[torch.randint(0, DRAFT_VOCAB, (BATCH, length), generator=g)]
    mask = torch.zeros(BATCH, length, dtype=torch.bool)
    mask[:, length // 3:] = True
    n_layers = len(spec.target_layer_ids)
    layers = torch.randn(BATCH, length, n_layers, HIDDEN, generator=g) if n_layers else None
    feats = Features(ids, torch.randn(BATCH, length, HIDDEN, generator=g), mask, layers)
    head = info.lm_head_weight[spec.vocab.ids].float()
    opt = torch.optim.AdamW([p for p in spec.parameters() if p.requires_grad], lr=1e-4, fused=True)
    obj = objective("kl", "never")

    def step(precision: str, kl: str) -> float:
        opt.zero_grad(set_to_none=True)
        start = time.perf_counter()
        with kl_path(kl):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
                loss, _ = spec.loss(feats, obj, lambda h, cols: _teacher(h, head))
            loss.float().backward()
        opt.step()
        return time.perf_counter() - start

    return step


def _teacher(hidden: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
    with torch.autocast("cpu", enabled=False):  # as training/module.py: the teacher in fp32
        return F.linear(hidden.float(), head)


def bench(family: str, length: int, rounds: int) -> dict[str, float]:
    step = family_step(family, length)
    variants = [(p, k) for p in ("fp32", "bf16") for k in ("torch", "fused")]
    for v in variants:  # warm (oneDNN builds a kernel per shape on first use)
        step(*v)
    samples: dict[tuple, list[float]] = {v: [] for v in variants}
    for r in range(rounds):
        for v in variants if r % 2 == 0 else variants[::-1]:
            samples[v].append(step(*v))
    return {f"{p}/{k}": round(1e3 * statistics.median(s), 1) for (p, k), s in samples.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="+", default=["mlp", "hydra", "eagle3"])
    parser.add_argument("--length", type=int, default=192, help="tokens per sequence")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"one training step, ms (median of {args.rounds}; batch {BATCH} x {args.length} tokens, "
          f"draft vocabulary {DRAFT_VOCAB}, {args.threads} threads)")
    for family in args.families:
        ms = bench(family, args.length, args.rounds)
        base = ms["fp32/torch"]
        print(f"{family:8s} " + "  ".join(f"{k} {v:7.1f} ({base / v:.2f}x)" for k, v in ms.items()))


if __name__ == "__main__":
    main()
