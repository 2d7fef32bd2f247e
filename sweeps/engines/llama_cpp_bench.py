"""`speclab bench --engine llama.cpp`: one exported draft measured in both engines, one process.

On the same prompt token ids (speclab's own encoding, chat template included) and the same
cores, alternating method by method prompt by prompt (eval/peers.compare), it decodes with

- speclab: plain decoding, and speculative decoding with the speculator as chains of k;
- llama.cpp (one llama-server per method, all started before the timing and idle between
  their turns): plain decoding, each n-gram type llama.cpp ships (not with --no-peers), and the exported draft
  (`--spec-type draft-eagle3`, chains of k, never cut short by a probability).

Each engine's speedups are over its own plain decoding, with paired bootstrap intervals, and
each engine's lossless check is against its own plain decoding. Acceptance length is tokens
per target pass in both: speclab's from its drafting steps; llama.cpp's from its own counters,
(predicted_n - 1) / (predicted_n - 1 - draft_n_accepted) (every token after the first comes
from a decode pass, which commits its accepted drafts plus one). Times include the prompt
(prompt_ms + predicted_ms: llama.cpp's own timings, no HTTP), as speclab's do.

The two engines decode different arithmetic of the same weights: llama.cpp the shipped Q4_1
GGUF with its quantised dot products, the draft in f32; speclab the same GGUF dequantised, in
its compute dtype. So their plain tokens can part after a near-tie, and the report counts the
prompts whose plain tokens agree across engines.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
from pathlib import Path

import numpy as np

from speclab.eval.engine import Generation

from . import llama_cpp

# llama.cpp's n-gram drafters (llama-server --spec-type), each at its own defaults
NGRAM_TYPES = ("ngram-simple", "ngram-map-k", "ngram-mod", "ngram-cache")
SPECLAB_PLAIN, LLAMA_PLAIN = "speclab plain", "llama.cpp plain"
# A fresh server's first request, untimed: token ids of no prompt of any set, so that what the n-gram
# drafters keep from it cannot match an answer
WARM_UP_IDS = (504, 3458, 282, 4649, 30)


class LlamaCppMethod:
    """A llama-server of its own as a bench method: prompt ids [1, T] -> Generation.

    `reset` restarts the server: llama.cpp's n-gram drafters keep what they decoded across
    requests (ngram-mod's and ngram-cache's pools), so without it a scoring would draft each prompt
    from an earlier scoring's answer to that very prompt, or from the warm-up's (eval/peers.compare
    resets every method after its warm-up)."""

    def __init__(self, engine: llama_cpp.LlamaCpp, target_gguf: Path, extra: list[str], threads: int,
                 max_new_tokens: int):
        self.engine, self.target_gguf, self.extra, self.threads = engine, target_gguf, extra, threads
        self.max_new_tokens = max_new_tokens
        self._running: contextlib.ExitStack | None = None
        self.url = ""

    def start(self) -> "LlamaCppMethod":
        self.stop()
        self._running = contextlib.ExitStack()
        self.url = self._running.enter_context(llama_cpp.server(self.engine, self.target_gguf, self.extra,
                                                                self.threads))
        llama_cpp.complete(self.url, list(WARM_UP_IDS), 8)  # the weights paged in, the graphs built: untimed
        return self

    def stop(self) -> None:
        if self._running is not None:
            self._running.close()
            self._running = None

    def reset(self) -> None:
        self.start()

    def __call__(self, prompt, max_new: int | None = None) -> Generation:
        answer = llama_cpp.complete(self.url, prompt[0].tolist(), max_new or self.max_new_tokens)
        return generation_of(answer)


def generation_of(answer: dict) -> Generation:
    """llama-server's answer as speclab's Generation: its counters, never a guess."""
    timings = answer["timings"]
    new = int(timings["predicted_n"])
    accepted = int(timings.get("draft_n_accepted") or 0)
    decode_passes = max(new - 1 - accepted, 0)
    return Generation(tokens=list(answer["tokens"]), seconds=(timings["prompt_ms"] + timings["predicted_ms"]) / 1000,
                      steps=1 + decode_passes, new_tokens=new, drafted_tokens=int(timings.get("draft_n") or 0))


def llama_methods(engine: llama_cpp.LlamaCpp, export, threads: int, max_new: int, stack: contextlib.ExitStack,
                  ngrams: bool = True) -> dict[str, LlamaCppMethod]:
    """Every llama.cpp method's server (its n-gram drafters unless `ngrams` is false), started now
    and stopped when `stack` closes."""
    flags = {LLAMA_PLAIN: [], **{f"llama.cpp {kind}": ["--spec-type", kind] for kind in NGRAM_TYPES if ngrams},
             f"llama.cpp {export.spec_type} k={export.k}": export.server_args()}
    methods = {}
    for name, extra in flags.items():
        methods[name] = LlamaCppMethod(engine, export.target_gguf, extra, threads, max_new)
        stack.callback(methods[name].stop)
        methods[name].start()
    return methods


def check_args(args: argparse.Namespace) -> None:
    if len(args.speculator) != 1:
        raise ValueError("bench --engine llama.cpp measures one exported draft: give exactly one --speculator")
    if args.assistant or args.tree or args.temperature > 0:
        raise ValueError("bench --engine llama.cpp compares greedy chains: drop --assistant, --tree and --temperature")


def cmd_bench_llama_cpp(args: argparse.Namespace) -> int:
    import torch

    from speclab.eval.engine import generate_plain, generate_speculative
    from speclab.eval.peers import compare
    from speclab.eval.prompts import encode_prompt
    from speclab.speculator.base import TargetInfo

    from ..bench import OwnSpeculator, prompt_sets
    from ..bench import check_args as check_bench_args
    from ..doctor import prepare_machine
    from ..errors import user_errors
    from ..export import export_for_engine
    from ..export_formats import load_checkpoint
    from ..results import find_speculator_checkpoint, write_json_atomic
    from ..target_spec import recorded_target
    from .serve import prepared, read_export

    with contextlib.ExitStack() as stack, user_errors():
        check_bench_args(args)
        check_args(args)
        engine = llama_cpp.require()
        source = args.speculator[0]
        checkpoint = find_speculator_checkpoint(source)
        if (source / llama_cpp.LLAMA_CPP_FILE).is_file():
            export = prepared(source)
        else:  # written for llama.cpp into a folder of its own, gone when the bench ends
            scratch = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="speclab-llama-cpp-")))
            export = read_export(export_for_engine(source, scratch / "export", "llama.cpp"))
        if args.k:
            export = type(export)(export.root, export.target_gguf, export.draft_gguf, export.spec_type, args.k)
        target_spec = recorded_target(checkpoint, args.overrides)
        target_config = target_spec.as_config()
        sets = prompt_sets(args)
        if args.threads:
            torch.set_num_threads(args.threads)
        threads = torch.get_num_threads()
        prepare_machine(target_config)
        target = target_spec.build()
        speculator = load_checkpoint(checkpoint, TargetInfo.of(target)).to(device=target.device,
                                                                            dtype=target.compute_dtype).eval()
        items = [item for prompts in sets.values() for item in prompts]
        encoded = [encode_prompt(target.tokenizer, item, chat_template=args.chat_template) for item in items]
        k, max_new = export.k, args.max_new_tokens
        spec_name = f"speclab {speculator.family} k={k}"
        methods = {SPECLAB_PLAIN: lambda p, n=None: generate_plain(target, p, n or max_new),
                   spec_name: OwnSpeculator(speculator, target.dtype, lambda s, p, n: generate_speculative(
                       target, s, p, n or max_new, k)),
                   **llama_methods(engine, export, threads, max_new, stack, ngrams=args.peers)}
        scorings = [compare(methods, encoded, baseline=SPECLAB_PLAIN) for _ in range(args.repeat)]
    report = {"scorings": [engine_report(runs, spec_name, k, args.resamples) for runs in scorings],
              # dtype: the weights', what `dtype: auto` chose
              "config": {"target_config": target_config, "dtype": str(target.dtype).removeprefix("torch."),
                         "speculator": str(source), "draft_gguf": str(export.draft_gguf),
                         "target_gguf": str(export.target_gguf), "k": k, "max_new_tokens": max_new,
                         "threads": threads, "prompts": {name: len(p) for name, p in sets.items()},
                         "llama_cpp": engine.info["version"], "repeat": args.repeat}}
    print(format_engine_report(report))
    if args.json_out:
        write_json_atomic(args.json_out, report)
    return 0


def engine_report(runs: dict, spec_name: str, k: int, resamples: int) -> dict:
    """Each engine summarised against its own plain decoding, and the engines' plain decoding
    against each other. Acceptance lengths come out of eval/metrics.tokens_per_pass: for llama.cpp
    from the pass count its counters give (generation_of)."""
    from speclab.eval.paired import speedup, speedup_interval
    from speclab.eval.peers import summarise

    speclab_runs = {name: run for name, run in runs.items() if name.startswith("speclab ")}
    llama_runs = {name: run for name, run in runs.items() if name.startswith("llama.cpp ")}
    rows = {**summarise(speclab_runs, baseline=SPECLAB_PLAIN, ks={spec_name: k}, resamples=resamples),
            **summarise(llama_runs, baseline=LLAMA_PLAIN, resamples=resamples)}
    for name, run in llama_runs.items():
        rows[name]["drafted"] = sum(g.drafted_tokens for g in run.generations)
        rows[name]["accepted"] = sum(g.new_tokens - g.steps for g in run.generations)
    plain_l, plain_s = runs[LLAMA_PLAIN].generations, runs[SPECLAB_PLAIN].generations
    figures = [(a.new_tokens, a.seconds, b.new_tokens, b.seconds) for a, b in zip(plain_l, plain_s)]
    return {"methods": rows,
            "llama_plain_vs_speclab_plain": {"ratio": float(speedup(np.asarray(figures, dtype=np.float64))),
                                             "ci": speedup_interval(figures, resamples=resamples)},
            "plain_tokens_agree": sum(_same_text(a.tokens, b.tokens) for a, b in zip(plain_l, plain_s)),
            "prompts": len(plain_l)}


def _same_text(llama_tokens: list[int], speclab_tokens: list[int]) -> bool:
    """llama.cpp leaves the end-of-generation token out of its tokens; speclab keeps it."""
    return llama_tokens == speclab_tokens[: len(llama_tokens)] and len(speclab_tokens) - len(llama_tokens) <= 1


def format_engine_report(report: dict) -> str:
    cfg = report["config"]
    lines = [f"speclab bench --engine llama.cpp: {cfg['speculator']}, chains of k={cfg['k']}, "
             f"max_new_tokens={cfg['max_new_tokens']}, threads={cfg['threads']}, prompts={cfg['prompts']}, "
             f"llama.cpp {cfg['llama_cpp']}"]
    for i, scoring in enumerate(report["scorings"]):
        lines.append(f"\nscoring {i + 1} of {len(report['scorings'])}: speedups over each engine's own plain decoding")
        lines.append(f"{'method':<34} {'tok/s':>7} {'speedup':>8} {'95% CI':>13} {'acc len':>7} "
                     f"{'drafted':>7} {'accepted':>8} {'lossless':>8}")
        for name, row in scoring["methods"].items():
            lo, hi = row["ci"]["speedup_total"]
            lossless = row["lossless"]
            lines.append(f"{name:<34} {row['tok_s']:>7.1f} {row['speedup_total']:>7.2f}x [{lo:.2f}, {hi:.2f}] "
                         f"{row['acceptance_length']:>7.2f} {row.get('drafted', ''):>7} {row.get('accepted', ''):>8} "
                         f"{lossless['checked_prompts'] - lossless['mismatches']}/{lossless['checked_prompts']}")
        cross = scoring["llama_plain_vs_speclab_plain"]
        lo, hi = cross["ci"]
        agree = f"{scoring['plain_tokens_agree']}/{scoring['prompts']}"
        lines.append(f"llama.cpp plain runs {cross['ratio']:.2f}x speclab plain's tok/s [{lo:.2f}, {hi:.2f}]; "
                     f"plain tokens agree across engines on {agree} prompts")
    return "\n".join(lines)


# --- the record behind docs/serving.md's table ---------------------------------------------------

ENGINE_COLUMNS = ("scoring", "engine", "method", "tok_s", "speedup", "ci_low", "ci_high", "acceptance_length",
                  "drafted", "accepted", "lossless", "vs_speclab_plain", "plain_agree", "machine", "cpu_flags", "date",
                  "dtype", "command")


def record_rows(report: dict, command: str, where: dict) -> list[dict]:
    """One row per method and scoring of a `bench --engine llama.cpp --json` report (data: every
    value is formatted from a number, never evaluated)."""
    rows = []
    dtype = str(report["config"].get("dtype") or "")  # the weights' dtype speclab's target resolved
    for i, scoring in enumerate(report["scorings"]):
        cross = scoring["llama_plain_vs_speclab_plain"]
        for name, row in scoring["methods"].items():
            lo, hi = row["ci"]["speedup_total"]
            lossless = row["lossless"]
            plain = name == LLAMA_PLAIN
            rows.append({
                "scoring": str(i + 1), "engine": name.split(" ", 1)[0], "method": name.split(" ", 1)[1],
                "tok_s": f"{float(row['tok_s']):.1f}", "speedup": f"{float(row['speedup_total']):.2f}",
                "ci_low": f"{float(lo):.2f}", "ci_high": f"{float(hi):.2f}",
                "acceptance_length": f"{float(row['acceptance_length']):.2f}",
                "drafted": str(int(row["drafted"])) if "drafted" in row else "",
                "accepted": str(int(row["accepted"])) if "accepted" in row else "",
                "lossless": f"{lossless['checked_prompts'] - lossless['mismatches']}/{lossless['checked_prompts']}",
                "vs_speclab_plain": f"{float(cross['ratio']):.2f}" if plain else "",
                "plain_agree": f"{int(scoring['plain_tokens_agree'])}/{int(scoring['prompts'])}" if plain else "",
                **where, "dtype": dtype, "command": command,  # where: machine, cpu_flags, date (report.this_machine)
            })
    return rows
