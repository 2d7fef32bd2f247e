"""The target runtime's speed against the memory-bandwidth bound and against transformers.

    python -m speclab.eval.runtime_bench [--dtypes fp32 bf16] [--widths 1 2 3 5 8 16 32 64]
                                         [--batches 8 16 32] [--prefills 128 256 512 768] [--json OUT]

`python -m speclab.sweeps.report record-runtime --json OUT --command CMD` appends a report's
row to docs/records/runtime.csv (the runtime table in docs/results.md; `record_row` below).

On the embedded SmolLM2 target, in one process (so machine noise hits every method alike):
- the machine's read bandwidth (a large fp32 sum) and the bound it puts on one decode step
  (the bytes of weights a step must read / bandwidth);
- ms per pass of 1 token (decode) and of 2..64 tokens (verification) at a 256-token
  context: the lean runtime, the transformers path behind FrozenTarget, and transformers'
  own `generate` (ms per generated token, 1-token steps only);
- a prompt's prefill at several lengths (the wide pass every request starts with; its
  attention grows with the square of the length);
- what the feature families add to a verification pass: the lean pass that also hands back
  the three layers eagle3 and the block drafters read (their default low/mid/high ids),
  interleaved with the plain lean pass;
- batched generation (self-distillation) tok/s at several batch sizes: the lean runtime's
  batched generation against transformers' `generate` with left padding, on chat prompts.
Each timing is the median of several repetitions, methods interleaved.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import time
from pathlib import Path

import torch
from transformers import DynamicCache, GenerationConfig

from speclab.kernels import native
from speclab.kernels.util.timing import alternated_ms

CONTEXT, REPEATS = 256, 7


def machine() -> dict:
    """Where and when the report was timed: what its record row names (record_row), wherever
    the row is written."""
    name, flags = native.cpu_info()
    isa = [f for f in native.PATH_FLAGS if f in flags]
    return {"cpu": name or "unknown CPU", "cores": os.cpu_count(), "isa": isa, "date": datetime.date.today().isoformat(),
            "threads": torch.get_num_threads(), "load_avg": os.getloadavg()[0]}


def timed_on(m: dict) -> dict:
    """The record columns naming where and when a report was timed (machine, cpu_flags, date),
    from its `machine` block: table cells, so plain words only (ValueError otherwise)."""
    named = (isinstance(m, dict) and isinstance(m.get("cpu"), str) and re.fullmatch(r"[\w .,()@/+-]{1,100}", m["cpu"])
             and isinstance(m.get("cores"), int) and isinstance(m.get("isa"), list)
             and all(isinstance(f, str) and re.fullmatch(r"[a-z0-9_]{1,32}", f) for f in m["isa"])
             and isinstance(m.get("date"), str) and re.fullmatch(r"\d{4}-\d{2}-\d{2}", m["date"]))
    if not named:
        raise ValueError("its machine block does not name a cpu, cores, isa flags and date in plain words")
    return {"machine": native.machine_label(m["cpu"], m["cores"]), "cpu_flags": " ".join(m["isa"]), "date": m["date"]}


def read_bandwidth_gb_s(megabytes: int = 1024) -> float:
    x = torch.ones(megabytes * (1 << 20) // 4)
    x.sum()
    best = min(_timed(lambda: x.sum()) for _ in range(5))
    return x.numel() * 4 / best / 1e9


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def weight_bytes(target) -> int:
    """Bytes one decode step must read: every layer's weights and the LM head (the embedding
    row lookup is negligible)."""
    model = target.model
    per_layer = sum(p.numel() * p.element_size() for p in model.model.layers.parameters())
    return per_layer + model.lm_head.weight.numel() * model.lm_head.weight.element_size()


def _ids(n: int, vocab: int, seed: int) -> torch.Tensor:
    return torch.randint(0, vocab, (1, n), generator=torch.Generator().manual_seed(seed))


def _pass(target, x: torch.Tensor, cache, **kwargs):
    """One lean pass of x into the cache, rolled back after: a timing that leaves no trace."""
    def run():
        target.lean.forward(x, cache, **kwargs)
        cache.rollback(x.shape[1])
    return run


def prefill_ms(target, lengths: list[int]) -> dict[int, float]:
    """Median ms of a prompt's prefill (the wide pass a request starts with: `invariant=False`,
    logits of its last token only) per prompt length, into a fresh cache."""
    return {T: alternated_ms({"prefill": _pass(target, _ids(T, target.vocab_size, T), target.lean.new_cache(max_len=T),
                                               logits_for="last", invariant=False)}, REPEATS)["prefill"]
            for T in lengths}


def capture_ms(target, widths: list[int]) -> dict[int, dict[str, float]]:
    """Median ms of a lean pass of T new tokens without and with the feature layers captured,
    per T, the two alternating so that machine noise hits both alike."""
    from speclab.speculator.eagle3 import default_layer_ids

    layer_ids = default_layer_ids(target.lean.config.num_layers)
    cache = target.lean.new_cache(max_len=CONTEXT + max(widths))
    target.lean.forward(_ids(CONTEXT, target.vocab_size, 0), cache, logits_for="none")
    out = {}
    for T in widths:
        x = _ids(T, target.vocab_size, T)
        ms = alternated_ms({"plain_ms": _pass(target, x, cache, logits_for="all"),
                            "layers_ms": _pass(target, x, cache, layer_ids=layer_ids, logits_for="all")}, 3 * REPEATS)
        out[T] = {**ms, "layer_ids": list(layer_ids)}
    return out


def pass_ms(target, widths: list[int], runtime: str) -> dict[int, float]:
    """Median ms of one pass of T new tokens at CONTEXT cached tokens, per T."""
    prompt = _ids(CONTEXT, target.vocab_size, 0)
    if runtime == "lean":
        cache = target.lean.new_cache(max_len=CONTEXT + max(widths))
        target.lean.forward(prompt, cache, logits_for="none")
    else:
        cache = DynamicCache(config=target.model.config)
        target.model(prompt, cache=cache)
    out = {}
    for T in widths:
        x = _ids(T, target.vocab_size, T)
        times = []
        for _ in range(REPEATS):
            if runtime == "lean":
                times.append(_timed(lambda: target.lean.forward(x, cache, logits_for="all")))
                cache.rollback(T)
            else:
                times.append(_timed(lambda: target.model(x, cache=cache)))
                cache.crop(-T)
        out[T] = statistics.median(times) * 1e3
    return out


def generate_ms_per_token(target, new_tokens: int = 64) -> float:
    prompt = _ids(CONTEXT, target.vocab_size, 1)
    config = GenerationConfig(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                              pad_token_id=0)
    target.model.generate(prompt, attention_mask=torch.ones_like(prompt),
                          generation_config=GenerationConfig(max_new_tokens=4, do_sample=False, pad_token_id=0))
    prefill = min(_timed(lambda: target.model(prompt)) for _ in range(2))
    total = min(_timed(lambda: target.model.generate(prompt, attention_mask=torch.ones_like(prompt),
                                                      generation_config=config)) for _ in range(2))
    return (total - prefill) / (new_tokens - 1) * 1e3


def chat_prompts(target, n: int) -> list[list[int]]:
    from speclab.speculator.target.prompts import prompt_ids

    topics = ["sorting a list", "a haiku about rain", "the capital of France", "binary search", "photosynthesis",
              "a polite email", "prime numbers", "unit tests in Python"]
    return [prompt_ids(target.tokenizer, [{"role": "user", "content": f"Tell me about {topics[i % len(topics)]} ({i})."}])
            for i in range(n)]


def batched_tok_s(target, batch: int, new_tokens: int = 64) -> dict[str, float]:
    """Generated tok/s of greedy batched generation: lean vs transformers' generate."""
    from speclab.speculator.target.runtime.generate import generate_batch
    from speclab.speculator.target.prompts import left_pad, pad_id

    prompts = chat_prompts(target, batch)
    never = {-1}  # no stop token: every row generates new_tokens, the work is equal
    start = time.perf_counter()
    out = generate_batch(target.lean, prompts, new_tokens, never)
    lean = sum(map(len, out)) / (time.perf_counter() - start)
    ids, mask = left_pad(prompts, pad_id(target), target.device)
    config = GenerationConfig(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                              pad_token_id=pad_id(target))
    start = time.perf_counter()
    hf_out = target.model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    hf = (hf_out.shape[1] - ids.shape[1]) * batch / (time.perf_counter() - start)
    return {"lean_tok_s": lean, "hf_generate_tok_s": hf, "ratio": lean / hf}


def run(dtypes: list[str], widths: list[int], batches: list[int], prefills: list[int]) -> dict:
    from speclab.speculator.target.builders import smollm2_from_gguf
    from speclab.speculator.target.measure import prepare_for

    report = {"machine": machine(), "context": CONTEXT, "read_bandwidth_gb_s": read_bandwidth_gb_s(), "dtypes": {}}
    for dtype in dtypes:
        prepare_for(smollm2_from_gguf, {"dtype": dtype})  # the machine profile this build reads
        target = smollm2_from_gguf(dtype=dtype)
        nbytes = weight_bytes(target)
        lean, hf = pass_ms(target, widths, "lean"), pass_ms(target, widths, "hf")
        entry = {
            "weight_mb": nbytes / 1e6,
            "bound_ms": nbytes / (report["read_bandwidth_gb_s"] * 1e9) * 1e3,
            "lean_ms": lean, "hf_path_ms": hf, "hf_generate_ms_per_token": generate_ms_per_token(target),
            "layer_capture": capture_ms(target, widths),
            "prefill_ms": prefill_ms(target, prefills),
            "runtime": target.runtime,
            "batched": {b: batched_tok_s(target, b) for b in batches},
        }
        entry["lean_vs_bound"] = lean[1] / entry["bound_ms"]
        entry["lean_vs_hf_generate"] = entry["hf_generate_ms_per_token"] / lean[1]
        report["dtypes"][dtype] = entry
        del target
    report["machine"]["load_avg_end"] = os.getloadavg()[0]
    return report


def print_report(report: dict) -> None:
    m = report["machine"]
    print(f"{m['cpu']} ({', '.join(m['isa'])}), {m['threads']} threads, load {m['load_avg']:.2f} -> "
          f"{m['load_avg_end']:.2f}; read bandwidth {report['read_bandwidth_gb_s']:.1f} GB/s; context {report['context']}")
    for dtype, e in report["dtypes"].items():
        print(f"\n{dtype} ({e['runtime']}): {e['weight_mb']:.0f} MB of weights per step, bound {e['bound_ms']:.2f} ms; "
              f"lean 1-token {e['lean_ms'][1]:.2f} ms = {e['lean_vs_bound']:.2f}x the bound; "
              f"transformers generate {e['hf_generate_ms_per_token']:.2f} ms/token "
              f"(lean {e['lean_vs_hf_generate']:.2f}x faster)")
        print(f"{'tokens per pass':>16} " + " ".join(f"{T:>7}" for T in e["lean_ms"]))
        print(f"{'lean ms':>16} " + " ".join(f"{v:7.2f}" for v in e["lean_ms"].values()))
        print(f"{'transformers ms':>16} " + " ".join(f"{v:7.2f}" for v in e["hf_path_ms"].values()))
        capture = e["layer_capture"]
        ids = next(iter(capture.values()))["layer_ids"]
        print(f"{'lean, again ms':>16} " + " ".join(f"{c['plain_ms']:7.2f}" for c in capture.values()))
        print(f"{f'+ layers {ids} ms':>16} " + " ".join(f"{c['layers_ms']:7.2f}" for c in capture.values())
              + "  (the two interleaved: the cost of handing a feature family its layers)")
        print(f"{'prompt tokens':>16} " + " ".join(f"{T:>7}" for T in e["prefill_ms"]))
        print(f"{'prefill ms':>16} " + " ".join(f"{v:7.1f}" for v in e["prefill_ms"].values()))
        for b, r in e["batched"].items():
            print(f"batched generation, batch {b}: lean {r['lean_tok_s']:.0f} tok/s, transformers generate "
                  f"{r['hf_generate_tok_s']:.0f} tok/s ({r['ratio']:.1f}x)")


# The record's columns (docs/records/runtime.csv): a report's step, its verification passes
# of 5 and 8 tokens, batched generation at 32 rows, transformers' generate and the longest
# prefill timed; a column whose width the report did not time is left empty.
RECORD_COLUMNS = ("machine", "cpu_flags", "date", "dtype", "read_gb_s", "bound_ms", "step_ms", "pass5_ms", "pass8_ms",
                  "batch32_tok_s", "generate_ms", "vs_generate", "prefill_tokens", "prefill_ms", "command")


def record_row(report: dict, dtype: str, command: str) -> dict:
    """The record row of one dtype of a report (`--json`), naming the machine the report was
    timed on (its `machine` block): every value formatted from a number or a string read out
    of the report, never evaluated."""
    timed = report.get("dtypes", {})
    if dtype not in timed:
        raise ValueError(f"the report has no {dtype} figures (it timed: {', '.join(timed) or 'none'})")
    e = timed[dtype]
    where = timed_on(report["machine"])

    def at(table: dict | None, key: int):
        """table's entry for a width (JSON has made its int keys strings), or None."""
        return (table or {}).get(str(key))

    def fixed(value, digits: int = 2) -> str:
        return "" if value is None else f"{float(value):.{digits}f}"

    longest = max((int(t) for t in e.get("prefill_ms", {})), default=None)
    batch32 = at(e.get("batched"), 32)
    return {**where, "dtype": dtype, "read_gb_s": fixed(report["read_bandwidth_gb_s"], 1),
            "bound_ms": fixed(e["bound_ms"]), "step_ms": fixed(at(e["lean_ms"], 1)),
            "pass5_ms": fixed(at(e["lean_ms"], 5)), "pass8_ms": fixed(at(e["lean_ms"], 8)),
            "batch32_tok_s": fixed(batch32 and batch32["lean_tok_s"], 0),
            "generate_ms": fixed(e["hf_generate_ms_per_token"]), "vs_generate": "",
            "prefill_tokens": "" if longest is None else str(longest),
            "prefill_ms": fixed(at(e["prefill_ms"], longest), 1), "command": command}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    parser.add_argument("--widths", nargs="+", type=int, default=[1, 2, 3, 5, 8, 16, 32, 64])
    parser.add_argument("--batches", nargs="*", type=int, default=[8, 16, 32], help="none: skip batched generation")
    parser.add_argument("--prefills", nargs="*", type=int, default=[128, 256, 512, 768],
                        help="prompt lengths whose prefill is timed")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--json", type=Path, default=None, help="also write the report here")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    report = run(args.dtypes, sorted(set(args.widths) | {1}), args.batches, args.prefills)
    print_report(report)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
